#!/bin/sh
# Entry point of the HAPI server container: the same `python -m hapi_server` that
# `hapi stack up --hapi-server` runs natively. Settings come from HAPI_* variables
# (hapi_server.settings.ServerSettings), e.g. HAPI_HOST, HAPI_PORT, HAPI_SWIFT_URL, HAPI_DEVICES.
set -eu
: "${HAPI_HOST:=0.0.0.0}"
: "${HAPI_PORT:=8090}"
: "${HAPI_SWIFT_URL:=http://swift:8080}"
export HAPI_HOST HAPI_PORT HAPI_SWIFT_URL
exec "${PYTHON:-python3}" -m hapi_server "$@"
