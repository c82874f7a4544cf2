"""The connection sits at the bottom of the client package: importing it loads no trainer."""

from __future__ import annotations

import inspect
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

    # Every parameter not given travels at the recipe's own default.
    defaults = {
        p.name: p.default
        for p in inspect.signature(hapi_client.finetune.run_finetune).parameters.values()
        if p.default is not inspect.Parameter.empty
    }
    calls: list[tuple[object, dict[str, object]]] = []

    def fake(client: object, **kwargs: object) -> str:
        calls.append((client, kwargs))
        return "result"

    monkeypatch.setattr(hapi_client.finetune, "run_finetune", fake)
    with HapiClient() as client:
        assert client.finetune(model="models/alexnet", container="c") == "result"  # type: ignore[comparison-overlap]
    assert calls == [(client, {**defaults, "model": "models/alexnet", "container": "c"})]


def test_the_method_shows_the_recipes_signature() -> None:
    """``inspect.signature(HapiClient.finetune)`` (a notebook's help and completion) lists the
    recipe's parameters with their defaults and types, as type checkers see them."""
    from hapi_client import HapiClient
    from hapi_client.finetune import run_finetune

    method, recipe = inspect.signature(HapiClient.finetune), inspect.signature(run_finetune)
    assert list(method.parameters)[0] == "self" and list(recipe.parameters)[0] == "client"
    assert list(method.parameters.values())[1:] == list(recipe.parameters.values())[1:]
    assert method.return_annotation == recipe.return_annotation
