"""The architecture listing: each network described once, kept on disk, keyed by what it depends on."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import hapi_models as hm
import pytest
from hapi_models import listing, listing_cache

PLUGIN = "tinycnn"  # examples/hapi-model-plugin, installed in the venv


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty cache directory, and a process that has described nothing yet."""
    monkeypatch.setenv(listing_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(listing, "_memo", {})
    yield tmp_path / "listing"


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a fresh process: nothing described in memory, the disk cache kept."""
    monkeypatch.setattr(listing, "_memo", {})


def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("traced although the cache holds it")

    monkeypatch.setattr(listing, "_traced", refuse)


def _tamper(cache: Path, name: str) -> None:
    """Rename the first split point in the stored entry of ``name``: what the cache is read for."""
    for path in cache.glob("*.json"):
        stored = json.loads(path.read_text())
        if stored["key"]["name"] == name:
            stored["entry"]["layer_names"][0] = "from-the-cache"
            path.write_text(json.dumps(stored))
            return
    raise AssertionError(f"{name} is not cached")


def test_a_description_is_the_split_points(cache: Path) -> None:
    described = hm.describe_model("alexnet")
    assert described.split_points() == hm.split_points("alexnet")
    spec = hm.get_spec("alexnet")
    assert described.default_freeze_index == spec.default_freeze_index
    assert (described.family, described.transform) == (spec.family, spec.transform)


def test_a_fresh_process_reads_the_cache_without_tracing(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = hm.describe_model("mobilenet_v3_small")
    assert len(list(cache.glob("*.json"))) == 1
    _forget(monkeypatch)
    _no_tracing(monkeypatch)
    assert hm.describe_model("mobilenet_v3_small") == first


def test_a_corrupt_entry_is_ignored_and_rebuilt_with_one_warning(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listing_cache, "_warned", set())
    expected = hm.describe_model("alexnet")
    hm.describe_model("resnet18")
    for path in cache.glob("*.json"):
        path.write_bytes(b'{"key": {"trunc')
    _forget(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger=listing_cache.__name__):
        assert hm.describe_model("alexnet") == expected
        hm.describe_model("resnet18")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ignored and rebuilt" in warnings[0].getMessage()
    _forget(monkeypatch)
    _no_tracing(monkeypatch)  # rewritten whole
    assert hm.describe_model("alexnet") == expected


def test_an_entry_of_another_key_is_not_read(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hm.describe_model("alexnet")
    (path,) = cache.glob("*.json")
    stored = json.loads(path.read_text())
    stored["key"]["libraries"]["torch"] = "0.0.1"
    stored["entry"]["layer_names"][0] = "from-the-cache"
    path.write_text(json.dumps(stored))
    _forget(monkeypatch)
    assert hm.describe_model("alexnet").layer_names[0] != "from-the-cache"
    assert json.loads(path.read_text())["key"] == listing_cache.entry_key("alexnet", "thesis")


@pytest.mark.parametrize(
    ("name", "distribution"), [("resnet18", "torch"), ("vit_b_16", "torchvision"), (PLUGIN, None)]
)
def test_the_listing_changes_when_a_version_changes(
    cache: Path, monkeypatch: pytest.MonkeyPatch, name: str, distribution: str | None
) -> None:
    """A library's version (or the plugin's own) is part of the key: what was cached under the
    old one is not listed under the new one."""
    assert name in hm.list_models()
    family = hm.get_spec(name).family
    distribution = distribution or family.removeprefix("plugin:")
    hm.describe_model(name)
    _tamper(cache, name)
    _forget(monkeypatch)
    assert hm.describe_model(name).layer_names[0] == "from-the-cache"

    real = listing_cache._version
    monkeypatch.setattr(
        listing_cache, "_version", lambda d: "99.0" if d == distribution else real(d)
    )
    _forget(monkeypatch)
    assert hm.describe_model(name).layer_names == hm.get_spec(name).layer_names


def test_the_listing_changes_when_a_plugin_module_or_the_models_sources_change(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = hm.get_spec(PLUGIN).family
    key = listing_cache.entry_key(PLUGIN, family)
    assert key["plugin"]["module_sha256"] is not None  # an editable plugin's edits count
    assert key["plugin"]["version"] is not None
    hm.describe_model(PLUGIN)
    _tamper(cache, PLUGIN)
    monkeypatch.setattr(listing_cache, "_sources_digest", lambda: "another hapi_models")
    _forget(monkeypatch)
    assert hm.describe_model(PLUGIN).layer_names == hm.get_spec(PLUGIN).layer_names


def test_an_unwritable_cache_costs_time_not_the_listing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(listing_cache.CACHE_ENV, str(blocker))
    monkeypatch.setattr(listing, "_memo", {})
    assert hm.describe_model("alexnet").split_points() == hm.split_points("alexnet")


def test_the_cache_directory_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(listing_cache.CACHE_ENV, str(tmp_path / "explicit"))
    assert listing_cache.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(listing_cache.CACHE_ENV)
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # not installed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert listing_cache.cache_dir() == tmp_path / "xdg" / "hapi"


def test_a_listing_traced_from_anywhere_keeps_its_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent listings start at random networks (to trace different ones first); the
    listing is in ``list_models`` order whatever the start, and each network described once."""
    names = ["a", "b", "c", "d"]
    asked: list[str] = []

    def describe(name: str) -> listing.ModelListing:
        asked.append(name)
        if name == "c":
            raise hm.UntraceableModelError("c: torch.fx cannot trace it")
        shapes = ((3, 8, 8), (4,))
        return listing.ModelListing(
            name, "test", hm.get_spec("alexnet").transform, ("x",), 0, shapes
        )

    monkeypatch.setattr(listing, "list_models", lambda: names)
    monkeypatch.setattr(listing, "broken_plugins", dict)
    monkeypatch.setattr(listing, "describe_model", describe)
    monkeypatch.setattr(listing.random, "randrange", lambda n: 2)
    listed = listing.describe_models()
    assert asked == ["c", "d", "a", "b"]
    assert [m.name for m in listed.models] == ["a", "b", "d"]
    assert listed.failed == {"c": "c: torch.fx cannot trace it"}
