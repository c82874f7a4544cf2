"""The connection sits at the bottom of the client package: importing it loads no trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ABOVE_THE_CONNECTION = (
    "hapi_client.finetune",
    "hapi_client.feature_dataset",
    "hapi_client.distributed",
    "hapi_client.planning",
)


def test_importing_the_client_loads_neither_the_recipe_nor_the_trainer() -> None:
    code = (
        "import hapi_client.client, sys; "
        f"loaded = [m for m in {ABOVE_THE_CONNECTION!r} if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_recipe_is_still_a_method_of_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """``client.finetune(...)`` (the README's call) is ``run_finetune(client, ...)``."""
    import hapi_client.finetune
    from hapi_client import HapiClient

    calls: list[tuple[object, dict[str, object]]] = []

    def fake(client: object, **kwargs: object) -> str:
        calls.append((client, kwargs))
        return "result"

    monkeypatch.setattr(hapi_client.finetune, "run_finetune", fake)
    with HapiClient() as client:
        assert client.finetune(model="models/alexnet", container="c") == "result"  # type: ignore[comparison-overlap]
    assert calls == [(client, {"model": "models/alexnet", "container": "c"})]
