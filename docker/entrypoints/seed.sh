#!/bin/sh
# One-shot seed: upload the demo dataset and model weights into Swift with the `hapi` CLI
# (idempotent: a second run uploads nothing). Runs natively as well as in the seed container.
#
#   ST_AUTH / ST_USER / ST_KEY   Swift tempauth (default http://swift:8080/auth/v1.0, test:tester)
#   HAPI_SEED_SOURCE             dataset source spec (default fashion-mnist:test?limit=2000)
#   HAPI_SEED_CONTAINER          dataset container (default fashion-mnist)
#   HAPI_SEED_SHARD_SIZE         samples per shard (default 1000, as in the thesis)
#   HAPI_SEED_ARCHS              architectures whose weights to store (default resnet18)
#   HAPI_SEED_NUM_CLASSES        classes of the stored heads (default 10)
#   HAPI_SEED_MODELS             weights container (default models)
#   HAPI_SEED_WAIT               seconds to wait for Swift's /healthcheck (default 300)
set -eu
: "${ST_AUTH:=http://swift:8080/auth/v1.0}"
: "${ST_USER:=test:tester}"
: "${ST_KEY:=testing}"
export ST_AUTH ST_USER ST_KEY
HAPI="${HAPI_CLI:-hapi}"
source="${HAPI_SEED_SOURCE:-fashion-mnist:test?limit=2000}"
container="${HAPI_SEED_CONTAINER:-fashion-mnist}"

# Wait for Swift's health ourselves: not every engine runs the compose healthchecks (podman
# without systemd) or honours `condition: service_healthy` (podman-compose).
health="${ST_AUTH%%/auth/*}/healthcheck"
"${PYTHON:-python3}" - "$health" "${HAPI_SEED_WAIT:-300}" <<'PY'
import sys, time, urllib.request

url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            if answer.status == 200:
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(f"seed: {url} did not answer 200 within {sys.argv[2]} s")
    time.sleep(1)
print(f"seed: Swift is healthy ({url})", flush=True)
PY

# The CLI retries as well, for a Swift that is healthy but still settling.
tries=0
until "$HAPI" upload dataset --source "$source" --container "$container" \
        --shard-size "${HAPI_SEED_SHARD_SIZE:-1000}" --no-progress; do
    tries=$((tries + 1))
    if [ "$tries" -ge "${HAPI_SEED_TRIES:-10}" ]; then
        echo "seed: giving up after $tries attempts" >&2
        exit 1
    fi
    sleep 3
done
for arch in ${HAPI_SEED_ARCHS:-resnet18}; do
    "$HAPI" upload model --arch "$arch" --num-classes "${HAPI_SEED_NUM_CLASSES:-10}" \
        --container "${HAPI_SEED_MODELS:-models}"
done
echo "seed: dataset $container and weights (${HAPI_SEED_ARCHS:-resnet18}) are in Swift"
