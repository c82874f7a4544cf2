"""``hapi finetune --verify-fraction F``: checked, refused with --workers, handed to the recipe."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any

import pytest

import hapi_client
from hapi_cli.main import main

BASE = ["finetune", "--model", "models/m", "--container", "c", "--quiet"]


def test_a_fraction_outside_zero_to_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*BASE, "--verify-fraction", "2"]) == 2
    assert "must be between 0 and 1" in capsys.readouterr().err


def test_it_is_refused_with_several_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--verify-fraction", "0.5", "--workers", "2"]) == 2
    assert "one process only" in capsys.readouterr().err


class _Recorder:
    """Stands in for HapiClient: records what the command asks of the recipe (a unit test)."""

    calls: list[dict[str, Any]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass

    def finetune(self, **kwargs: Any) -> SimpleNamespace:
        _Recorder.calls.append(kwargs)
        return SimpleNamespace(
            split=None, history=[], extra={"verified_samples": 8, "verified_shards": 2}
        )


def test_the_fraction_reaches_the_recipe_and_the_count_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hapi_client, "HapiClient", _Recorder)
    assert main([*BASE, "--verify-fraction", "0.25"]) == 0
    assert _Recorder.calls[-1]["verify_fraction"] == 0.25
    assert "verified 8 samples of 2 shards" in capsys.readouterr().out


def test_a_feature_cache_dir_without_workers_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 28, case 12: it was silently ignored by the one-process path.
    assert main([*BASE, "--feature-cache-dir", str(tmp_path)]) == 2
    assert "--feature-cache-dir works with --workers N" in capsys.readouterr().err
