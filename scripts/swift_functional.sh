#!/usr/bin/env bash
# `make swift-functional`: run OpenStack Swift's own functional test suite (test/functional of the
# Swift release installed in .venv) through three proxies and check that they pass, fail and skip
# the same tests:
#
#   plain      the stack's proxy pipeline without the HAPI filter
#   decoupled  with the filter, `execution = decoupled`, forwarding to the stack's HAPI server
#   in_proxy   with the filter, `execution = in_proxy`
#
# Per configuration: `hapi stack up` on free ports in a state dir of its own (so each run starts
# from an empty cluster), a proxy of its own on those storage servers (the stack's proxy config,
# rendered by hapi_stack, plus the tempauth users the suite wants: scripts/swift_functional.py),
# a test.conf pointing at it, `pytest test/functional` in Swift's source distribution (the
# s3api tests left out: the pipeline has no s3api), then the proxy stopped by PID and
# `hapi stack down`. Finally the passed/failed/skipped counts and times of each run and the
# symmetric differences of the sets; the exit status is 1 if the sets differ.
#
# It stops exactly what it started (each proxy by PID, each stack with `hapi stack down`). It keeps
# its cache (HAPI_FUNC_CACHE, default ~/.cache/hapi-swift-functional: Swift's sdist, unpacked),
# and its run directory (logs, configs, JUnit files) when the runs differ or HAPI_FUNC_KEEP=1.
#
# Environment: HAPI_FUNC_CACHE, HAPI_FUNC_MODES (default "plain decoupled in_proxy"),
# HAPI_FUNC_TESTS (pytest arguments instead of the whole suite, e.g.
# "test/functional/test_object.py"), HAPI_FUNC_TIMEOUT (seconds per test, default 300),
# HAPI_FUNC_KEEP=1 (keep the run directory), HAPI_FUNC_PIPELINE (stack, the default, or saio: the
# pipeline of Swift's SAIO proxy config, see scripts/swift_functional.py). docs/swift-functional.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
PY=$VENV/bin/python
CACHE=${HAPI_FUNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hapi-swift-functional}
read -r -a MODES <<<"${HAPI_FUNC_MODES:-plain decoupled in_proxy}"
read -r -a TESTS <<<"${HAPI_FUNC_TESTS:-test/functional --ignore=test/functional/s3api}"
TIMEOUT=${HAPI_FUNC_TIMEOUT:-300}
PIPELINE=${HAPI_FUNC_PIPELINE:-stack}
NICE=(nice -n 10)
HOST=127.0.0.1
RUN=$(mktemp -d "${TMPDIR:-/tmp}/hapi-swift-functional.XXXXXX")
cd "$ROOT"

PROXY_PID=""
STACKS=()
RESULTS=()

say() { printf '== %s\n' "$*"; }
fail() { printf '== FAILED: %s\n' "$*" >&2; exit 2; }
now() { date +%s.%N; }
since() { "$PY" -c "import sys; print(f'{$(now) - $1:.0f}')"; }

stop_proxy() {
    [ -n "$PROXY_PID" ] || return 0
    kill "$PROXY_PID" 2>/dev/null || true
    wait "$PROXY_PID" 2>/dev/null || true
    PROXY_PID=""
}

stop_stack() {  # STATE_DIR
    "$VENV/bin/hapi" stack down --state-dir "$1" >>"$1.down.log" 2>&1 ||
        say "hapi stack down --state-dir $1 failed: see $1.down.log"
}

cleanup() {
    local code=$?
    set +e
    stop_proxy
    for dir in "${STACKS[@]}"; do stop_stack "$dir"; done
    if [ "$code" = 0 ] && [ "${HAPI_FUNC_KEEP:-0}" != 1 ]; then
        rm -rf "$RUN"
    else
        say "logs, configs and JUnit files kept in $RUN"
    fi
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Swift's source distribution of the installed release: its test/functional is the suite.
sources() {
    [ -x "$PY" ] || fail "no $PY: run \`make install\` first"
    "$PY" -c 'import swiftclient, pytest, pytest_timeout' 2>/dev/null ||
        fail "the suite needs python-swiftclient, pytest and pytest-timeout in .venv: run \`make install\`"
    command -v memcached >/dev/null || fail "no memcached (the stack's token cache): \`make system-deps\`"
    VERSION=$("$PY" -c 'from importlib.metadata import version; print(version("swift"))')
    SRC=$CACHE/swift-$VERSION
    if [ ! -f "$SRC/.unpacked" ]; then
        mkdir -p "$CACHE"
        [ -f "$CACHE/swift-$VERSION.tar.gz" ] ||
            "$VENV/bin/pip" download --quiet --no-binary :all: --no-deps "swift==$VERSION" -d "$CACHE"
        rm -rf "$SRC"
        tar -xzf "$CACHE/swift-$VERSION.tar.gz" -C "$CACHE"
        touch "$SRC/.unpacked"
    fi
    [ -d "$SRC/test/functional" ] || fail "$SRC has no test/functional"
    say "Swift $VERSION (installed in .venv); its functional tests from $SRC"
}

wait_proxy() {  # URL LOG: until the proxy's /healthcheck answers
    local deadline=$((SECONDS + 120))
    until curl -fsS -o /dev/null --max-time 3 "$1/healthcheck" 2>/dev/null; do
        kill -0 "$PROXY_PID" 2>/dev/null || fail "the proxy exited: $(tail -n 20 "$2")"
        [ $SECONDS -lt $deadline ] || fail "$1/healthcheck did not answer within 120 s"
        sleep 0.5
    done
}

run_mode() {  # MODE
    local mode=$1 dir=$RUN/$1 start ports url rc
    mkdir -p "$dir"
    start=$(now)
    read -r -a ports <<<"$("$PY" -c 'from hapi_stack import pick_free_ports; print(*pick_free_ports(7))')"
    say "$mode: hapi stack up --state-dir $dir/stack (ports ${ports[*]:0:6})"
    STACKS+=("$dir/stack")
    "${NICE[@]}" "$VENV/bin/hapi" stack up --state-dir "$dir/stack" --host "$HOST" \
        --memcached-port "${ports[0]}" --account-port "${ports[1]}" \
        --container-port "${ports[2]}" --object-port "${ports[3]}" \
        --proxy-port "${ports[4]}" --hapi-port "${ports[5]}" --timeout 180 \
        >"$dir/stack-up.log" 2>&1 || fail "hapi stack up: $(tail -n 20 "$dir/stack-up.log")"

    url=http://$HOST:${ports[6]}
    "$PY" scripts/swift_functional.py proxy-conf --state-dir "$dir/stack" --mode "$mode" \
        --port "${ports[6]}" --pipeline "$PIPELINE" --out "$dir/proxy.conf"
    "${NICE[@]}" "$VENV/bin/swift-proxy-server" "$dir/proxy.conf" -v >"$dir/proxy.log" 2>&1 &
    PROXY_PID=$!
    wait_proxy "$url" "$dir/proxy.log"
    say "$mode: proxy $url (PID $PROXY_PID): $(grep '^pipeline' "$dir/proxy.conf")"
    say "$mode: /info: $("$PY" scripts/swift_functional.py check-info --url "$url" --mode "$mode")"
    "$PY" scripts/swift_functional.py accounts --url "$url"
    "$PY" scripts/swift_functional.py test-conf --url "$url" --out "$dir/test.conf"

    say "$mode: pytest ${TESTS[*]} (log: $dir/pytest.log)"
    rc=0
    (cd "$SRC" && SWIFT_TEST_CONFIG_FILE=$dir/test.conf SWIFT_TEST_IN_PROCESS=0 \
        "${NICE[@]}" "$PY" -m pytest "${TESTS[@]}" -o 'python_files=test*.py' \
        -p no:cacheprovider -q --timeout "$TIMEOUT" --junitxml "$dir/junit.xml" \
        >"$dir/pytest.log" 2>&1) || rc=$?
    # 0: all passed, 1: some failed; anything else (interrupted, usage, no tests) is no result.
    [ "$rc" -le 1 ] && [ -s "$dir/junit.xml" ] ||
        fail "$mode: pytest exited $rc: $(tail -n 30 "$dir/pytest.log")"
    say "$mode: $(tail -n 1 "$dir/pytest.log")"

    stop_proxy
    stop_stack "$dir/stack"
    unset 'STACKS[-1]'
    RESULTS+=("$mode:$dir/junit.xml:$(since "$start")")
}

main() {
    local total rc=0
    total=$(now)
    sources
    say "pipeline: $PIPELINE; runs: ${MODES[*]}"
    for mode in "${MODES[@]}"; do run_mode "$mode"; done
    "$PY" scripts/swift_functional.py compare "${RESULTS[@]}" || rc=$?
    say "all ${#MODES[@]} runs took $(since "$total") s"
    return "$rc"
}

# One line, read whole before it runs: editing this file during a run cannot derail it.
main "$@"; exit $?
