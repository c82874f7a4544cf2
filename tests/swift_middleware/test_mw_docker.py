"""The compose file and the containers' entry points, checked without a Docker engine.

``docker-compose config`` (Debian's docker-compose 1.29) validates the file; the entry points
the images run are run natively here, against real Swift processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from swiftclient.client import Connection

from hapi_stack import PORT_SETTINGS, RunningStack, StackConfig
from tests.hapi_server.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINTS = ROOT / "docker" / "entrypoints"
COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose is not installed (apt-get install docker-compose)"
)


def compose_config(*args: str) -> dict[str, Any]:
    assert COMPOSE is not None
    done = subprocess.run(
        [COMPOSE, "-f", str(ROOT / "docker-compose.yml"), *args, "config"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = yaml.safe_load(done.stdout)
    return loaded


@needs_compose
def test_docker_compose_accepts_the_file() -> None:
    services = compose_config()["services"]
    assert set(services) == {"swift", "swift-in-proxy", "hapi-server", "hapi-server-gpu", "seed"}
    swift = services["swift"]
    assert "/healthcheck" in " ".join(swift["healthcheck"]["test"])
    assert [p["target"] for p in swift["ports"]] == [8080]
    servers = swift["environment"]["HAPI_FILTER_HAPI_SERVERS"]
    assert "http://hapi-server:8090" in servers and "http://hapi-server-gpu:8090" in servers
    for name in ("hapi-server", "hapi-server-gpu"):
        service = services[name]
        assert "/healthz" in " ".join(service["healthcheck"]["test"])
        assert (
            service["environment"]["HAPI_SWIFT_URL"]
            == swift["environment"]["HAPI_FILTER_SWIFT_URL"]
        )
        assert service["depends_on"]["swift"]["condition"] == "service_healthy"
    gpu = services["hapi-server-gpu"]
    assert gpu["profiles"] == ["gpu"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "deploy" not in services["hapi-server"]  # the default server needs no GPU
    assert services["hapi-server"]["build"]["args"]["TORCH_INDEX_URL"].endswith("/cpu")
    in_proxy = services["swift-in-proxy"]
    assert in_proxy["profiles"] == ["in-proxy"]
    assert in_proxy["build"]["args"]["HAPI_INSTALL"] == "full"
    assert in_proxy["environment"]["HAPI_FILTER_EXECUTION"] == "in_proxy"
    assert in_proxy["image"] != swift["image"]  # the filter-only image stays small
    seed = services["seed"]
    assert seed["entrypoint"] == ["/opt/hapi/docker/entrypoints/seed.sh"]
    assert seed["depends_on"]["swift"]["condition"] == "service_healthy"
    assert seed["restart"] == "no"


def test_the_images_run_entry_points_that_exist() -> None:
    for dockerfile in ("docker/swift/Dockerfile", "docker/hapi-server/Dockerfile"):
        text = (ROOT / dockerfile).read_text()
        [entry] = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
        script = json.loads(entry)[-1]
        assert script.startswith("/opt/hapi/"), script
        path = ROOT / script.removeprefix("/opt/hapi/")
        assert path.is_file() and os.access(path, os.X_OK), path
        assert "COPY . /opt/hapi" in text
    for script in ENTRYPOINTS.glob("*.sh"):
        assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0, script


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling a condition with a deadline
    raise AssertionError(f"{url} not healthy:\n{log.read_text(errors='replace')[-4000:]}")


def _blocked_signals(pid: int) -> set[signal.Signals]:
    """The signals ``pid`` has blocked, from the SigBlk mask in /proc/PID/status."""
    status = Path(f"/proc/{pid}/status").read_text()
    [mask] = re.findall(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)
    bits = int(mask, 16)
    return {s for s in signal.Signals if 0 < s < 64 and bits & (1 << (s - 1))}


@pytest.mark.swift
@pytest.mark.slow
def test_the_swift_entry_point_runs_the_stack_with_the_filter_until_sigterm(
    tmp_path: Path,
) -> None:
    ports = StackConfig.on_free_ports(state_dir=tmp_path)
    env = {
        **os.environ,
        "HAPI_STATE_DIR": str(tmp_path / "state"),
        "HAPI_STACK_HOST": "127.0.0.1",
        "HAPI_FILTER_HAPI_SERVERS": f"http://127.0.0.1:{free_port()}",
        "HAPI_FILTER_HEALTH_TIMEOUT": "1",
        "HAPI_CHECK_INTERVAL": "0.5",
        **{f"HAPI_STACK_{s.upper()}": str(getattr(ports, s)) for s in PORT_SETTINGS},
    }
    log = tmp_path / "entrypoint.log"
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, str(ENTRYPOINTS / "swift_stack.py")],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    proxy = f"http://127.0.0.1:{ports.proxy_port}"
    try:
        _wait_http(f"{proxy}/healthcheck", proc, log)
        auth = httpx.get(
            f"{proxy}/auth/v1.0", headers={"X-Auth-User": "test:tester", "X-Auth-Key": "testing"}
        )
        assert auth.status_code == 200
        assert httpx.get(f"{proxy}/info").json()["hapi"]["execution"] == "decoupled"
        # The filter is in the pipeline: its HAPI server is down, so a HAPI request is its 503.
        token, url = auth.headers["x-auth-token"], auth.headers["x-storage-url"]
        httpx.put(f"{url}/c", headers={"X-Auth-Token": token}).raise_for_status()
        httpx.put(f"{url}/c/o", content=b"x", headers={"X-Auth-Token": token}).raise_for_status()
        hapi = httpx.post(
            f"{url}/c/o", json={}, headers={"X-Auth-Token": token, "X-Hapi-Request": "extract"}
        )
        assert hapi.status_code == 503 and hapi.json()["code"] == "no_hapi_server"
        assert (tmp_path / "state" / "pids.json").is_file()
        # The services must not inherit a blocked SIGTERM, or every container stop waits out
        # the grace period and kills them.
        record = json.loads((tmp_path / "state" / "pids.json").read_text())
        blocked = {s["name"]: _blocked_signals(s["pid"]) for s in record["services"]}
        assert len(blocked) == 5, blocked
        assert all(signal.SIGTERM not in b and signal.SIGINT not in b for b in blocked.values())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text(errors="replace")[-4000:]
    assert not (tmp_path / "state" / "pids.json").exists()  # every service was stopped
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{proxy}/healthcheck", timeout=2)


@pytest.mark.swift
@pytest.mark.slow
def test_the_seed_entry_point_uploads_dataset_and_weights(
    swift_stack: RunningStack, swift_conn: Connection, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "ST_AUTH": swift_stack.auth_url,
        "HAPI_CLI": str(Path(sys.executable).parent / "hapi"),
        "HAPI_SEED_SOURCE": "digits:test?limit=40",
        "HAPI_SEED_CONTAINER": "hapi-seed-digits",
        "HAPI_SEED_SHARD_SIZE": "16",
        "HAPI_SEED_ARCHS": "resnet18",
        "HAPI_SEED_MODELS": "hapi-seed-models",
    }
    done = subprocess.run(
        ["sh", str(ENTRYPOINTS / "seed.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seed: dataset hapi-seed-digits and weights (resnet18) are in Swift" in done.stdout
    _, objects = swift_conn.get_container("hapi-seed-digits")
    names = {o["name"] for o in objects}
    assert "manifest.json" in names and len(names) == 1 + 3  # 40 samples in shards of 16
    _, models = swift_conn.get_container("hapi-seed-models")
    assert {"resnet18.safetensors", "resnet18.json"} <= {o["name"] for o in models}


@pytest.mark.swift
@pytest.mark.slow
def test_the_hapi_server_entry_point_serves_healthz(
    swift_stack: RunningStack, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "HAPI_HOST": "127.0.0.1",
        "HAPI_PORT": str(port),
        "HAPI_SWIFT_URL": swift_stack.proxy_url,
        "HAPI_TORCH_THREADS": "1",
    }
    log = tmp_path / "hapi-server.log"
    proc = subprocess.Popen(  # noqa: S603
        ["sh", str(ENTRYPOINTS / "hapi-server.sh")],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        assert health["swift"] is True and health["swift_url"] == swift_stack.proxy_url
    finally:
        proc.send_signal(signal.SIGTERM)  # the script exec'd python: this is the server
        code = proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    # uvicorn shuts down cleanly, then re-raises the signal it got.
    assert code in (0, -signal.SIGTERM), text[-4000:]
    assert "Application shutdown complete" in text
