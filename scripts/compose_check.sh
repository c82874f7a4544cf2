#!/usr/bin/env bash
# `make compose-check`: build the compose file's images, bring the stack up, run the README's
# container commands, check their results, and bring everything down again.
#
# Steps: engine (docker compose where a Docker daemon answers; podman + podman-compose otherwise,
# installed and configured when missing), base images (pulled, or built from Debian with
# mmdebstrap when no registry answers), the torch wheel index (the PyTorch CPU index, or a local
# PEP 503 index from `pip download` when that cannot be reached), build, `up -d`, health, the seed
# (`logs -f seed`), a fine-tuning through Swift's HAPI filter with a split above 0, one raw
# `curl` extraction, the same extraction through the in-proxy execution (the `in-proxy` profile's
# Swift, hapi/swift:full) and its refusal of a request that cannot fit its memory budget, `down -v`,
# and a check that no container, volume or network is left.
#
# It removes exactly what it created (the compose project's containers, volumes and networks,
# its client containers, the index server by PID). It keeps the images and its cache
# (HAPI_CHECK_CACHE, default ~/.cache/hapi-compose-check: podman's storage and settings, the base
# root filesystem, the wheels), so a second run skips what is done.
#
# Environment: HAPI_CHECK_CACHE, HAPI_CHECK_PROJECT (compose project, default hapicheck),
# HAPI_CHECK_ENGINE (docker or podman: skip the detection), TORCH_INDEX_URL (use this index).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${HAPI_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hapi-compose-check}
PROJECT=${HAPI_CHECK_PROJECT:-hapicheck}
PUBLIC_TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1)
PODMAN_COMPOSE_VERSION=1.6.0
BASES=(docker.io/library/python:3.11-slim-bookworm docker.io/library/debian:bookworm-slim)
IMAGES=(hapi/swift:local hapi/swift:full hapi/hapi-server:cpu)
NICE=(nice -n 10)
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
RUN=$(mktemp -d "${TMPDIR:-/tmp}/hapi-compose-check.XXXXXX")
mkdir -p "$CACHE"
cd "$ROOT"

STEP_NAMES=()
STEP_SECONDS=()
DID=()
INDEX_PID=""
STACK_UP=0
CLIENTS=()

say() { printf '== %s\n' "$*"; }
did() { DID+=("$*"); say "$*"; }
fail() { printf '== FAILED: %s\n' "$*" >&2; exit 1; }

# timed NAME COMMAND...: run it, record its wall time.
timed() {
    local name=$1 start end
    shift
    say "step: $name"
    start=$(date +%s.%N)
    "$@"
    end=$(date +%s.%N)
    STEP_NAMES+=("$name")
    STEP_SECONDS+=("$(python3 -c "print(f'{$end - $start:.1f}')")")
    say "step: $name took ${STEP_SECONDS[-1]} s"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_free() {
    python3 -c "import socket,sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $1)) == 0)"
}

wait_http() {  # URL SECONDS: until URL answers 200
    local deadline=$((SECONDS + $2))
    until curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null; do
        [ $SECONDS -lt $deadline ] || fail "$1 did not answer 200 within $2 s"
        sleep 1
    done
}

apt_install() {
    for try in $(seq 30); do
        $SUDO apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null && break
        [ "$try" = 30 ] && fail "apt-get update"
        sleep 10
    done
    "${NICE[@]}" $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@" >"$RUN/apt.log" 2>&1 \
        || { tail -n 20 "$RUN/apt.log"; fail "apt-get install $*"; }
}

# --- engine ------------------------------------------------------------------------------------

use_docker() {
    ENGINE=docker
    COMPOSE=(docker compose -p "$PROJECT" -f docker-compose.yml --profile in-proxy)
    did "engine: Docker $(docker version --format '{{.Server.Version}}') with docker compose"
}

use_podman() {
    ENGINE=podman
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    # The compose file's `init: true`: podman runs catatonit for it.
    [ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
    if [ ${#missing[@]} -gt 0 ]; then
        apt_install "${missing[@]}"
        did "podman needed ${missing[*]}: installed from Debian"
    fi
    # crun (podman's default) cannot start containers on hosts like this one (setrlimit refused,
    # hybrid cgroups): runc, explicit ulimits and cgroupfs do. Files of our own, /etc untouched.
    local conf=$CACHE/podman
    mkdir -p "$conf/storage" "$conf/run"
    cat >"$conf/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
    cat >"$conf/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$conf/storage"
runroot = "$conf/run"
EOF
    cat >"$conf/registries.conf" <<EOF
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
EOF
    export CONTAINERS_CONF=$conf/containers.conf
    export CONTAINERS_STORAGE_CONF=$conf/storage.conf
    export CONTAINERS_REGISTRIES_CONF=$conf/registries.conf
    # The OCI format drops HEALTHCHECK; the docker format keeps it in the images.
    export BUILDAH_FORMAT=docker
    local venv=$CACHE/podman-compose-venv
    if ! "$venv/bin/podman-compose" version >/dev/null 2>&1; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "podman-compose==$PODMAN_COMPOSE_VERSION" \
            2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
        did "installed podman-compose $PODMAN_COMPOSE_VERSION from PyPI (Debian's 1.0.3 is too old)"
    fi
    # podman-compose does not pass the compose file's build.network on: give it directly.
    COMPOSE=("$venv/bin/podman-compose" -p "$PROJECT" -f docker-compose.yml --profile in-proxy
        "--podman-build-args=--network host")
    did "engine: podman $(podman version --format '{{.Client.Version}}') (runc, cgroupfs; settings in $conf) with podman-compose $PODMAN_COMPOSE_VERSION"
}

choose_engine() {
    case "${HAPI_CHECK_ENGINE:-}" in
        docker) use_docker ;;
        podman) use_podman ;;
        "")
            if command -v docker >/dev/null && docker info >/dev/null 2>&1 \
                && docker compose version >/dev/null 2>&1; then
                use_docker
            else
                say "no Docker daemon answers: using podman"
                use_podman
            fi
            ;;
        *) fail "HAPI_CHECK_ENGINE must be docker or podman" ;;
    esac
}

# --- base images -------------------------------------------------------------------------------

image_exists() { $ENGINE image inspect "$1" >/dev/null 2>&1; }

build_local_base() {
    command -v mmdebstrap >/dev/null || apt_install mmdebstrap
    local tar=$CACHE/bookworm-python-rootfs.tar
    if [ ! -s "$tar" ]; then
        # The real python image keeps python and pip's scripts in /usr/local/bin and lets pip
        # install system-wide; the proxy's CA files, if this host has any, make pip's TLS work.
        local cas=()
        for ca in /usr/local/share/ca-certificates/*.crt; do
            [ -f "$ca" ] && cas+=(--customize-hook="copy-in $ca /usr/local/share/ca-certificates")
        done
        "${NICE[@]}" mmdebstrap --quiet --variant=apt --format=tar \
            --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
            --customize-hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED' \
            --customize-hook='ln -sf /usr/bin/python3 "$1"/usr/local/bin/python3' \
            --customize-hook='ln -sf /usr/bin/python3 "$1"/usr/local/bin/python' \
            "${cas[@]}" \
            --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1' \
            bookworm "$tar.partial"
        mv "$tar.partial" "$tar"
    fi
    $ENGINE import "$tar" "${BASES[0]}" >/dev/null 2>&1
    $ENGINE tag "${BASES[0]}" "${BASES[1]}"
    did "no registry reachable: built the base image from Debian bookworm with mmdebstrap ($(du -h "$tar" | cut -f1) root filesystem, python3 and CA files), tagged ${BASES[*]}"
}

ensure_bases() {
    local missing=()
    for base in "${BASES[@]}"; do
        if image_exists "$base"; then
            say "base image $base is present"
        elif timeout 120 $ENGINE pull -q "$base" >/dev/null 2>&1; then
            did "pulled $base"
        else
            missing+=("$base")
        fi
    done
    [ ${#missing[@]} -eq 0 ] || build_local_base
}

# --- the torch wheel index ----------------------------------------------------------------------

write_simple_index() {  # WHEELS_DIR INDEX_DIR: a PEP 503 index of the wheels in WHEELS_DIR
    python3 - "$1" "$2" <<'PY'
import html, re, sys
from pathlib import Path

wheels, index = Path(sys.argv[1]), Path(sys.argv[2])
projects: dict[str, list[Path]] = {}
for wheel in sorted(wheels.glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    projects.setdefault(name, []).append(wheel)
for name, files in projects.items():
    page = index / "simple" / name
    page.mkdir(parents=True, exist_ok=True)
    links = "".join(
        f'<a href="../../wheels/{html.escape(f.name)}">{html.escape(f.name)}</a>\n' for f in files
    )
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
root = "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(projects))
(index / "simple" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{root}</body></html>\n")
print(len(projects))
PY
}

ensure_torch_index() {
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        did "torch wheels: from TORCH_INDEX_URL=$TORCH_INDEX_URL"
        return
    fi
    if curl -fsS -o /dev/null --max-time 20 "$PUBLIC_TORCH_INDEX/torch/" 2>/dev/null; then
        TORCH_INDEX_URL=$PUBLIC_TORCH_INDEX
        did "torch wheels: the PyTorch CPU index ($PUBLIC_TORCH_INDEX)"
        return
    fi
    local index=$CACHE/index
    mkdir -p "$index/wheels"
    # Whatever pip on this host can reach (PyPI, or local wheel files): torch's own dependencies
    # included, since the image's pip sees only this index for them.
    "${NICE[@]}" python3 -m pip download -q --no-cache-dir -d "$index/wheels" "${TORCH_PINS[@]}" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    local projects
    projects=$(write_simple_index "$index/wheels" "$index")
    # The same port as last time when it is free: the index URL is a build argument, so a new
    # one would invalidate the cached torch layer.
    local port
    port=$(cat "$index/port" 2>/dev/null || true)
    if [ -z "$port" ] || ! port_free "$port"; then port=$(free_port); fi
    echo "$port" >"$index/port"
    python3 -m http.server --bind 127.0.0.1 --directory "$index" "$port" >"$RUN/index.log" 2>&1 &
    INDEX_PID=$!
    TORCH_INDEX_URL=http://127.0.0.1:$port/simple
    wait_http "$TORCH_INDEX_URL/torch/" 30
    did "$PUBLIC_TORCH_INDEX unreachable: served ${TORCH_PINS[*]} and their dependencies ($projects projects, $(du -sh "$index/wheels" | cut -f1)) from a local index at $TORCH_INDEX_URL (pid $INDEX_PID)"
}

# --- the stack ---------------------------------------------------------------------------------

container_of() {  # SERVICE: the id of the project's container for SERVICE
    $ENGINE ps -a -q --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | head -n 1
}

leftovers() {
    {
        $ENGINE ps -a --format '{{.Names}}' --filter "label=com.docker.compose.project=$PROJECT"
        $ENGINE volume ls -q | grep -E "^${PROJECT}_" || true
        $ENGINE network ls --format '{{.Name}}' | grep -E "^${PROJECT}_" || true
        if [ "$ENGINE" = podman ]; then podman pod ls --format '{{.Name}}' | grep -E "$PROJECT" || true; fi
    } | sort -u
}

cleanup() {
    local code=$?
    set +e
    for name in "${CLIENTS[@]}"; do $ENGINE rm -f "$name" >/dev/null 2>&1; done
    if [ "$STACK_UP" = 1 ]; then
        say "cleaning up: ${COMPOSE[*]} down -v"
        "${COMPOSE[@]}" down -v >/dev/null 2>&1
    fi
    if [ -n "$INDEX_PID" ]; then
        kill "$INDEX_PID" 2>/dev/null && wait "$INDEX_PID" 2>/dev/null
        say "stopped the local wheel index (pid $INDEX_PID)"
    fi
    rm -rf "$RUN"
    exit $code
}
trap cleanup EXIT
trap 'exit 130' INT TERM

build() {  # SERVICE IMAGE: build it; drop the image it replaced once nothing tags that one
    local old new
    old=$($ENGINE image inspect --format '{{.Id}}' "$2" 2>/dev/null || true)
    "${NICE[@]}" "${COMPOSE[@]}" build "$1" >"$RUN/build-$1.log" 2>&1 \
        || { tail -n 40 "$RUN/build-$1.log"; fail "building $1"; }
    new=$($ENGINE image inspect --format '{{.Id}}' "$2")
    if [ -n "$old" ] && [ "$old" != "$new" ] \
        && [ -z "$($ENGINE image inspect --format '{{join .RepoTags ","}}' "$old" 2>/dev/null)" ]; then
        $ENGINE rmi "$old" >/dev/null 2>&1 && say "removed the image this build replaced ($old)"
    fi
    return 0
}

up() {
    STACK_UP=1
    "${COMPOSE[@]}" up -d >"$RUN/up.log" 2>&1 || { tail -n 40 "$RUN/up.log"; fail "up -d"; }
}

wait_service() {  # SERVICE URL: until URL answers 200; fail at once if SERVICE's container exits
    local id deadline=$((SECONDS + 300))
    id=$(container_of "$1")
    until curl -fsS -o /dev/null --max-time 3 "$2" 2>/dev/null; do
        if [ "$($ENGINE inspect --format '{{.State.Running}}' "$id")" != true ]; then
            $ENGINE logs "$id" 2>&1 | tail -n 20
            fail "$1 exited before $2 answered"
        fi
        [ $SECONDS -lt $deadline ] || fail "$2 did not answer 200 within 300 s"
        sleep 1
    done
}

wait_healthy() {
    wait_service swift "http://127.0.0.1:$HAPI_SWIFT_PORT/healthcheck"
    wait_service hapi-server "http://127.0.0.1:$HAPI_SERVER_PORT/healthz"
    # The images' own healthchecks, run once by hand: podman without systemd never runs them.
    for service in swift hapi-server; do
        local id
        id=$(container_of "$service")
        if [ "$ENGINE" = podman ]; then
            podman healthcheck run "$id" >/dev/null || fail "the healthcheck of $service fails"
        else
            local deadline=$((SECONDS + 300))
            until [ "$(docker inspect --format '{{.State.Health.Status}}' "$id")" = healthy ]; do
                [ $SECONDS -lt $deadline ] || fail "$service never became healthy"
                sleep 2
            done
        fi
    done
    say "Swift (:$HAPI_SWIFT_PORT) and the HAPI server (:$HAPI_SERVER_PORT) are healthy; their healthchecks pass"
}

seed() {
    # The README's command: it follows the seed's log until the seed exits.
    timeout 900 "${COMPOSE[@]}" logs -f seed | tee "$RUN/seed.log"
    local id code
    id=$(container_of seed)
    code=$($ENGINE inspect --format '{{.State.ExitCode}}' "$id")
    [ "$code" = 0 ] || fail "the seed exited $code"
    grep -q "seed: dataset fashion-mnist and weights (resnet18) are in Swift" "$RUN/seed.log" \
        || fail "the seed did not report its upload"
}

client() {  # NAME ARGS...: a container of the HAPI image on the host network, running ARGS
    local name=${PROJECT}-client-$1
    shift
    CLIENTS+=("$name")
    $ENGINE run --rm --name "$name" --network host --no-healthcheck -v "$RUN:/out" \
        -e ST_AUTH="http://127.0.0.1:$HAPI_SWIFT_PORT/auth/v1.0" -e ST_USER=test:tester \
        -e ST_KEY=testing --entrypoint "" hapi/hapi-server:cpu "$@"
}

extracted_samples() {  # the HAPI server's count of samples it ran extraction on
    curl -fsS --max-time 10 "http://127.0.0.1:$HAPI_SERVER_PORT/metrics" | python3 -c '
import re, sys
print(int(sum(float(v) for v in re.findall(r"^hapi_samples_total\{endpoint=\"extract\"\} (\S+)$", sys.stdin.read(), re.M))))'
}

finetune() {
    # A held-out set to measure accuracy on: 500 images of Fashion-MNIST's training split.
    client upload hapi upload dataset --source "fashion-mnist:train?limit=500" \
        --container fashion-mnist-heldout --no-progress
    local before
    before=$(extracted_samples)
    # The README's command, with a split above 0 so that the filter forwards to the HAPI server.
    client finetune hapi finetune --auth-url "http://127.0.0.1:$HAPI_SWIFT_PORT/auth/v1.0" \
        --user test:tester --key testing --model models/resnet18 --container fashion-mnist \
        --eval-container fashion-mnist-heldout --mode hapi --via swift --split 4 --epochs 1 \
        --image-size 64 --quiet --metrics-json /out/finetune.json
    local after
    after=$(extracted_samples)
    EXTRACTED=$((after - before))
    [ "$EXTRACTED" -gt 0 ] || fail "the HAPI server extracted nothing: the filter did not forward"
    read -r SPLIT ACCURACY < <(python3 - "$RUN/finetune.json" <<'PY'
import json, sys

result = json.load(open(sys.argv[1]))
last = result["history"][-1]
print(last["split_index"], last["eval_accuracy"])
PY
)
    # Ten classes: a fine-tuned head well above chance (0.1) shows the features were right.
    python3 -c "import sys; sys.exit(not ($SPLIT > 0 and $ACCURACY > 0.3))" \
        || fail "split $SPLIT, accuracy $ACCURACY: expected a split above 0 and accuracy above 0.3"
    did "fine-tuning through the Swift filter: split $SPLIT, held-out accuracy $ACCURACY; the HAPI server extracted $EXTRACTED samples for it (its /metrics)"
}

curl_extract() {
    local auth=http://127.0.0.1:$HAPI_SWIFT_PORT/auth/v1.0
    local token storage
    read -r token storage < <(auth "$auth" main)
    curl -fsS -H "X-Auth-Token: $token" -o "$RUN/resnet18.json" "$storage/models/resnet18.json"
    curl -fsS -H "X-Auth-Token: $token" -o "$RUN/manifest.json" "$storage/fashion-mnist/manifest.json"
    local shard
    shard=$(python3 - "$RUN" <<'PY'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
model, manifest = (json.loads((run / n).read_text()) for n in ("resnet18.json", "manifest.json"))
shards = manifest["shards"]
first = shards[0] if isinstance(shards[0], str) else shards[0]["name"]
body = {
    "model": {
        "arch": "resnet18",
        "num_classes": 10,
        "weights": {"container": "models", "object": model["object"], "sha256": model["sha256"]},
    },
    "split_index": 4,
    "transform": {"resize": 64, "crop": 64, "mean": [0.485, 0.456, 0.406],
                  "std": [0.229, 0.224, 0.225]},
    "b_max": 64,
}
(run / "extract.json").write_text(json.dumps(body))
print(first)
PY
)
    local status
    status=$(curl -sS -o "$RUN/frames.bin" -D "$RUN/extract.h" -w '%{http_code}' -X POST \
        -H "X-Auth-Token: $token" -H "X-Hapi-Request: extract" \
        -H "Content-Type: application/json" --data-binary "@$RUN/extract.json" \
        "$storage/fashion-mnist/$shard")
    [ "$status" = 200 ] || fail "curl extraction answered $status: $(head -c 400 "$RUN/frames.bin")"
    grep -qi '^content-type: application/x-hapi-frames' "$RUN/extract.h" \
        || fail "curl extraction: not an x-hapi-frames stream"
    # Decode it with the project's own decoder, in the image.
    cat >"$RUN/decode.py" <<'PY'
import sys

from hapi_contract.frames import FrameDecoder

decoder = FrameDecoder()
data = open(sys.argv[1], "rb").read()
frames = decoder.feed(data)
end = decoder.close()
shape = tuple(frames[0].features.shape)
print(f"{end.samples} samples in {end.frames} frames, features {shape[1:]}, {len(data)} bytes")
PY
    CURL_RESULT=$(client decode python3 /out/decode.py /out/frames.bin) \
        || fail "the curl extraction's frames do not decode"
    [ -n "$CURL_RESULT" ] || fail "the curl extraction's frames do not decode"
    did "curl extraction of fashion-mnist/$shard at split 4 through Swift: 200, $CURL_RESULT"
    SHARD=$shard
}

auth() {  # AUTH_URL NAME: "token storage_url" of test:tester at AUTH_URL
    curl -fsS -D "$RUN/auth-$2.h" -o /dev/null -H "X-Auth-User: test:tester" \
        -H "X-Auth-Key: testing" "$1"
    echo "$(grep -i '^x-auth-token:' "$RUN/auth-$2.h" | cut -d' ' -f2 | tr -d '\r')" \
        "$(grep -i '^x-storage-url:' "$RUN/auth-$2.h" | cut -d' ' -f2 | tr -d '\r')"
}

in_proxy_extract() {
    # The in-proxy Swift is an all-in-one of its own: give it the seeded shard and weights.
    local port=$HAPI_IN_PROXY_PORT token storage token2 storage2 weights
    wait_service swift-in-proxy "http://127.0.0.1:$port/healthcheck"
    read -r token storage < <(auth "http://127.0.0.1:$HAPI_SWIFT_PORT/auth/v1.0" main)
    read -r token2 storage2 < <(auth "http://127.0.0.1:$port/auth/v1.0" in-proxy)
    weights=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["object"])' \
        "$RUN/resnet18.json")
    for object in "fashion-mnist/$SHARD" "models/$weights"; do
        curl -fsS -X PUT -H "X-Auth-Token: $token2" "$storage2/${object%%/*}"
        curl -fsS -H "X-Auth-Token: $token" -o "$RUN/copy" "$storage/$object"
        curl -fsS -X PUT -H "X-Auth-Token: $token2" -T "$RUN/copy" "$storage2/$object"
    done
    local status
    status=$(curl -sS -o "$RUN/in-proxy.bin" -D "$RUN/in-proxy.h" -w '%{http_code}' -X POST \
        -H "X-Auth-Token: $token2" -H "X-Hapi-Request: extract" \
        -H "Content-Type: application/json" --data-binary "@$RUN/extract.json" \
        "$storage2/fashion-mnist/$SHARD")
    [ "$status" = 200 ] || fail "in-proxy extraction answered $status: $(head -c 400 "$RUN/in-proxy.bin")"
    grep -qi '^x-hapi-execution: in_proxy' "$RUN/in-proxy.h" \
        || fail "the in-proxy extraction did not run in the proxy"
    local result
    result=$(client decode-in-proxy python3 /out/decode.py /out/in-proxy.bin) \
        || fail "the in-proxy extraction's frames do not decode"
    # The same samples and feature shape as through the HAPI server (frame count and bytes follow
    # each host's planned COS batch).
    features() { sed -E 's/^([0-9]+) samples in [0-9]+ frames, features (\([^)]*\)).*/\1 \2/' <<<"$1"; }
    [ "$(features "$result")" = "$(features "$CURL_RESULT")" ] \
        || fail "in-proxy: $result; through the HAPI server: $CURL_RESULT"
    did "the same extraction inside the proxy (hapi/swift:full, execution = in_proxy): 200, $result"
    # resnet18 up to layer 14 on 1024x1024 inputs: even the smallest COS batch exceeds 2 GiB.
    python3 - "$RUN" <<'PY'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
body = json.loads((run / "extract.json").read_text())
body.update(split_index=14, transform={**body["transform"], "resize": 1024, "crop": 1024})
(run / "too-big.json").write_text(json.dumps(body))
PY
    status=$(curl -sS -o "$RUN/too-big.out" -w '%{http_code}' -X POST \
        -H "X-Auth-Token: $token2" -H "X-Hapi-Request: extract" \
        -H "Content-Type: application/json" --data-binary "@$RUN/too-big.json" \
        "$storage2/fashion-mnist/$SHARD")
    [ "$status" = 507 ] && grep -q '"code": *"insufficient_memory"' "$RUN/too-big.out" \
        || fail "the in-proxy execution answered $status to a request over its budget: $(head -c 400 "$RUN/too-big.out")"
    local memory
    memory=$($ENGINE stats --no-stream --format '{{.MemUsage}}' "$(container_of swift-in-proxy)")
    did "a request over the in-proxy budget (resnet18, split 14, 1024x1024): 507 insufficient_memory; the Swift container's memory after both requests: $memory"
}

down() {
    "${COMPOSE[@]}" down -v >"$RUN/down.log" 2>&1 || { tail -n 40 "$RUN/down.log"; fail "down -v"; }
    STACK_UP=0
    local left
    left=$(leftovers)
    [ -z "$left" ] || fail "left behind after down -v: $left"
    did "down -v left no container, volume, network or pod of project $PROJECT"
}

# --- main --------------------------------------------------------------------------------------

main() {
    export HAPI_SWIFT_PORT=${HAPI_SWIFT_PORT:-8080} HAPI_SERVER_PORT=${HAPI_SERVER_PORT:-8090}
    port_free "$HAPI_SWIFT_PORT" || HAPI_SWIFT_PORT=$(free_port)
    port_free "$HAPI_SERVER_PORT" || HAPI_SERVER_PORT=$(free_port)
    export HAPI_IN_PROXY_PORT=${HAPI_IN_PROXY_PORT:-8081}
    port_free "$HAPI_IN_PROXY_PORT" || HAPI_IN_PROXY_PORT=$(free_port)
    timed "engine" choose_engine
    if [ -n "$(leftovers)" ]; then
        fail "project $PROJECT already has containers, volumes or networks (set HAPI_CHECK_PROJECT): $(leftovers | tr '\n' ' ')"
    fi
    timed "base images" ensure_bases
    timed "torch wheel index" ensure_torch_index
    export TORCH_INDEX_URL
    timed "build swift" build swift hapi/swift:local
    timed "build swift-in-proxy" build swift-in-proxy hapi/swift:full
    # The seed runs the same image (hapi/hapi-server:cpu): one build serves both.
    timed "build hapi-server" build hapi-server hapi/hapi-server:cpu
    timed "up -d" up
    timed "healthy" wait_healthy
    timed "seed (logs -f seed)" seed
    timed "finetune via swift" finetune
    timed "curl extraction" curl_extract
    timed "in-proxy extraction" in_proxy_extract
    timed "down -v" down

    echo
    say "compose-check passed"
    for line in "${DID[@]}"; do echo "   - $line"; done
    echo "   steps:"
    for i in "${!STEP_NAMES[@]}"; do printf '     %-44s %8s s\n' "${STEP_NAMES[$i]}" "${STEP_SECONDS[$i]}"; done
    echo "   images:"
    for image in "${IMAGES[@]}" "${BASES[@]}"; do
        printf '     %-44s %s\n' "$image" \
            "$($ENGINE image inspect --format '{{.Size}}' "$image" | python3 -c 'import sys; print(f"{int(sys.stdin.read()) / 1e6:.0f} MB")')"
    done
    echo "   kept: the images above and $CACHE (remove with: $ENGINE rmi ${IMAGES[*]}; rm -rf $CACHE)"
}

main "$@"
