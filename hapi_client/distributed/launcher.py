"""Start a multi-worker run from an ordinary process: torchrun as a subprocess.

``launch(7, config)`` runs ``python -m torch.distributed.run --standalone --nproc-per-node 7
-m hapi_client.distributed CONFIG.json`` on this machine, waits for it and returns rank 0's
:class:`~.trainer.DistributedResult` (read back from the JSON it wrote). The CLI and the tests
use it; on a cluster, run the same module under your own ``torchrun`` invocation instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..client import HapiClient
from ..preflight import preflight as run_preflight
from ..swift_session import SwiftCredentials
from .checkpoint import load_checkpoint
from .config import DistributedConfig
from .errors import DistributedConfigError, LaunchError
from .trainer import DistributedResult, for_world

__all__ = ["launch", "launch_many", "torchrun_command"]

log = logging.getLogger(__name__)

_GRACE_S = 20.0


def torchrun_command(
    nproc: int,
    config_paths: Sequence[str | Path],
    *,
    python: str = sys.executable,
    log_level: str = "warning",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The torchrun command line that :func:`launch` runs (single node, standalone rendezvous)."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        *extra_args,
        "-m",
        "hapi_client.distributed",
        *(str(p) for p in config_paths),
        "--log-level",
        log_level,
    ]


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop torchrun and its workers: they share the new session we started it in."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(
    nproc: int,
    config: DistributedConfig,
    *,
    credentials: SwiftCredentials | None = None,
    log_path: str | Path | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    log_level: str = "warning",
    python: str = sys.executable,
    stream_output: bool = False,
    preflight: bool = True,
    max_restarts: int = 0,
) -> DistributedResult:
    """Run ``config`` on ``nproc`` local workers under torchrun and return rank 0's result.

    Credentials travel in ``ST_AUTH``/``ST_USER``/``ST_KEY`` (never in the config file).
    ``log_path`` keeps torchrun's and the workers' output (else a temporary file, whose tail
    is part of the :class:`LaunchError` on failure); with ``stream_output`` and no ``log_path``
    the output goes to this process's stdout/stderr instead (progress bars, logs).
    ``timeout_s`` stops the whole run. ``preflight``: check Swift, the containers, the model
    and the server in seconds before any worker starts (:func:`~hapi_client.preflight.preflight`).
    ``max_restarts``: torchrun restarts the workers that often after a failure; with
    ``config.checkpoint_dir`` they resume from the last checkpoint.
    """
    return launch_many(
        nproc,
        [config],
        credentials=credentials,
        log_path=log_path,
        timeout_s=timeout_s,
        env=env,
        log_level=log_level,
        python=python,
        stream_output=stream_output,
        preflight=preflight,
        max_restarts=max_restarts,
    )[0]


def _preflight(configs: Sequence[DistributedConfig], credentials: SwiftCredentials | None) -> None:
    """Check what the runs need once, here, before torchrun starts a worker."""
    from .setup import credentials_or_env

    creds = credentials_or_env(credentials)
    seen = set()
    for config in configs:
        key = (config.endpoint, config.via, config.mode, config.model)
        containers = (config.container, config.eval_container)
        if (key, containers) in seen:
            continue
        seen.add((key, containers))
        with HapiClient(config.endpoint, creds, via=config.via) as client:
            run_preflight(client, model=config.model, containers=containers, mode=config.mode)


def launch_many(
    nproc: int,
    configs: Sequence[DistributedConfig],
    *,
    credentials: SwiftCredentials | None = None,
    log_path: str | Path | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    log_level: str = "warning",
    python: str = sys.executable,
    stream_output: bool = False,
    preflight: bool = True,
    max_restarts: int = 0,
) -> list[DistributedResult]:
    """Run ``configs`` one after the other in a single torchrun job (see :func:`~.trainer.run_sequence`).

    The workers start (and extract features through HAPI) once for the whole sequence, e.g.
    a comparison of aggregation rules. Returns rank 0's results in order; see :func:`launch`.
    """
    if nproc < 1:
        raise DistributedConfigError(f"nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise DistributedConfigError(f"max_restarts must be >= 0, got {max_restarts}")
    if not configs:
        return []
    for config in configs:
        # A damaged checkpoint, or a rule that no longer holds in this world, fails here, in
        # one line, rather than in every worker.
        resume = load_checkpoint(config.checkpoint_dir) if config.checkpoint_dir else None
        for_world(config, nproc, resume)
    if preflight:
        _preflight(configs, credentials)
    with tempfile.TemporaryDirectory(prefix="hapi-dist-") as tmp:
        paths: list[Path] = []
        results: list[Path] = []
        for i, config in enumerate(configs):
            out = (
                Path(config.results_path)
                if config.results_path
                else Path(tmp) / f"results-{i}.json"
            )
            out.unlink(missing_ok=True)
            path = Path(tmp) / f"config-{i}.json"
            path.write_text(config.replace(results_path=str(out)).to_json())
            paths.append(path)
            results.append(out)
        log_file = Path(log_path) if log_path else Path(tmp) / "torchrun.log"
        streaming = stream_output and log_path is None
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("OMP_NUM_THREADS", str(configs[0].threads or 1))
        if max_restarts:
            # torch 2.14: restarted workers otherwise meet the previous group's keys in the
            # agent's shared store and fail in init_process_group (docs/robust.md).
            child_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        if credentials is not None:
            child_env.update(
                ST_AUTH=credentials.auth_url, ST_USER=credentials.user, ST_KEY=credentials.key
            )
        restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
        cmd = torchrun_command(
            nproc, paths, python=python, log_level=log_level, extra_args=restarts
        )
        log.info("launching %d workers: %s", nproc, " ".join(cmd))
        with contextlib.ExitStack() as stack:
            out_file = None if streaming else stack.enter_context(log_file.open("wb"))
            proc = subprocess.Popen(
                cmd,
                env=child_env,
                stdout=out_file,  # noqa: S603
                stderr=None if streaming else subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _stop_group(proc)
                raise LaunchError(
                    f"{nproc} workers did not finish within {timeout_s:.0f} s",
                    log_tail=_tail(log_file),
                ) from None
            except BaseException:
                _stop_group(proc)
                raise
        if returncode != 0:
            raise LaunchError(
                f"torchrun with {nproc} workers exited with status {returncode}",
                returncode=returncode,
                log_tail=_tail(log_file),
            )
        out_results = []
        for path in results:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise LaunchError(
                    f"the workers wrote no readable results to {path}: {exc}",
                    log_tail=_tail(log_file),
                ) from exc
            out_results.append(DistributedResult.from_dict(data))
        return out_results
