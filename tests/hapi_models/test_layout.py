"""channels_last per head: chosen once per key, kept on disk for a restarted host, and equal to the contiguous head within float
tolerance (a different kernel, not a different function)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hapi_models
import pytest
import torch
from hapi_models import layout, listing_cache
from hapi_models.layout import LayoutChooser, run_in_chunks, to_layout

# Convolutions reordered for another layout round differently; features agree to float32 noise.
CLOSE: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize(("arch", "split"), [("efficientnet_lite0", 9), ("resnet18", 5)])
def test_a_head_on_a_channels_last_input_gives_the_same_features(arch: str, split: int) -> None:
    torch.manual_seed(0)
    head = hapi_models.get_model(arch, num_classes=10).head(split)
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = head(x)
        last = head(to_layout(x, True))
        chosen = LayoutChooser().forward((arch, split), head, x)
    torch.testing.assert_close(last, plain, **CLOSE)
    torch.testing.assert_close(chosen, plain, **CLOSE)


def test_the_choice_is_measured_once_per_key_and_kept() -> None:
    calls: list[torch.Tensor] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x * 2

    chooser = LayoutChooser()
    x = torch.ones(1, 3, 4, 4)
    assert chooser.known("k") is None
    assert chooser.forward("k", head, x).equal(x * 2)
    assert chooser.known("k") in (True, False)
    measured = len(calls)
    # One sample to size the probe, then a warm-up and the timed runs per layout.
    assert measured == 1 + 2 * (1 + layout._TIMED_RUNS)
    chooser.forward("k", head, x)
    assert len(calls) == measured + 1


def test_off_or_not_an_image_batch_runs_the_head_as_given() -> None:
    calls: list[torch.Tensor] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x

    LayoutChooser(enabled=False).forward("k", head, torch.ones(1, 3, 4, 4))
    LayoutChooser().forward("k", head, torch.ones(3, 4))
    assert len(calls) == 2 and all(c.is_contiguous() for c in calls)


# A restarted host must not time itself into the other layout: features would move a few ulps.


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(listing_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(listing_cache, "_warned", set())
    return tmp_path / layout.STORE_KIND


def _timings(monkeypatch: pytest.MonkeyPatch, contiguous_s: float, last_s: float) -> list[int]:
    """Stand in for the two timings: fixed seconds, and a count of layouts timed."""
    timed: list[int] = []

    def fake(
        head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        timed.append(1)
        return (
            last_s if x.is_contiguous(memory_format=torch.channels_last) else contiguous_s
        ), head(x)

    monkeypatch.setattr(layout, "_timed", fake)
    return timed


KEY = ("efficientnet_lite0", 9, (3, 8, 8), "cpu")
X = torch.ones(2, 3, 8, 8)


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_restarted_host_reuses_the_kept_choice_without_timing(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _timings(monkeypatch, contiguous_s=2.0, last_s=1.0)
    LayoutChooser(persist=True).forward(KEY, _double, X)
    assert len(list(cache.glob("*.json"))) == 1
    # The next process would time channels_last slower: it keeps the first one's choice.
    timed = _timings(monkeypatch, contiguous_s=1.0, last_s=2.0)
    restarted = LayoutChooser(persist=True)
    assert restarted.forward(KEY, _double, X).equal(X * 2)
    assert restarted.known(KEY) is True and timed == []
    # Another torch reads nothing of it and times again.
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    other = LayoutChooser(persist=True)
    other.forward(KEY, _double, X)
    assert other.known(KEY) is False and len(timed) == 2


def test_without_persist_nothing_is_kept_on_disk(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _timings(monkeypatch, contiguous_s=2.0, last_s=1.0)
    LayoutChooser().forward(KEY, _double, X)
    assert not cache.exists()


def test_a_corrupt_kept_choice_is_timed_again_with_one_warning_and_rewritten(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _timings(monkeypatch, contiguous_s=2.0, last_s=1.0)
    LayoutChooser(persist=True).forward(KEY, _double, X)
    key2 = (*KEY[:2], (3, 16, 16), "cpu")
    LayoutChooser(persist=True).forward(key2, _double, X)
    for path in cache.glob("*.json"):
        path.write_bytes(b'{"key": {"trunc')
    timed = _timings(monkeypatch, contiguous_s=1.0, last_s=2.0)
    with caplog.at_level(logging.WARNING, logger=listing_cache.__name__):
        again = LayoutChooser(persist=True)
        assert again.forward(KEY, _double, X).equal(X * 2)
        again.forward(key2, _double, X)
    assert again.known(KEY) is False and len(timed) == 4
    assert len(caplog.records) == 1 and "ignored" in caplog.records[0].getMessage()
    timed.clear()
    restarted = LayoutChooser(persist=True)
    restarted.forward(KEY, _double, X)
    assert restarted.known(KEY) is False and timed == []  # rewritten whole


def test_an_unwritable_cache_costs_a_timing_and_one_warning_never_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    monkeypatch.setenv(listing_cache.CACHE_ENV, str(blocker / "cache"))
    monkeypatch.setattr(listing_cache, "_warned", set())
    timed = _timings(monkeypatch, contiguous_s=2.0, last_s=1.0)
    with caplog.at_level(logging.WARNING, logger=listing_cache.__name__):
        for _ in range(2):
            chooser = LayoutChooser(persist=True)
            assert chooser.forward(KEY, _double, X).equal(X * 2)
            assert chooser.known(KEY) is True
    assert len(timed) == 4  # nothing kept: each process times
    assert len(caplog.records) == 1 and "not cached" in caplog.records[0].getMessage()


def test_a_key_json_cannot_hold_is_timed_and_kept_in_memory_only(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _timings(monkeypatch, contiguous_s=2.0, last_s=1.0)
    chooser = LayoutChooser(persist=True)
    chooser.forward(frozenset({1}), _double, X)
    assert chooser.known(frozenset({1})) is True and not cache.exists()


def test_a_request_that_measured_while_another_chose_answers_in_the_kept_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two first requests of a key measure at once and may disagree: both answer in the layout
    kept (the first chosen), else one key's features come from two layouts."""
    chooser = LayoutChooser()

    def another_request_chose_first(
        head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        chooser._choices.setdefault(KEY, False)  # the other request's choice lands meanwhile
        last = x.is_contiguous(memory_format=torch.channels_last)
        return (1.0 if last else 2.0), head(x)  # this request times channels_last faster

    monkeypatch.setattr(layout, "_timed", another_request_chose_first)

    def which_layout(x: torch.Tensor) -> torch.Tensor:
        return torch.tensor(x.is_contiguous(memory_format=torch.channels_last))

    assert chooser.forward(KEY, which_layout, X).item() is False
    assert chooser.known(KEY) is False


def test_a_large_first_batch_is_timed_on_a_probe_and_run_once_in_the_kept_layout() -> None:
    """The timing costs a few samples per layout: the whole batch runs once, in the layout kept."""
    sizes: list[tuple[int, bool]] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        sizes.append((len(x), x.is_contiguous(memory_format=torch.channels_last)))
        return x * 2

    chooser = LayoutChooser()
    x = torch.arange(20 * 3 * 4 * 4, dtype=torch.float32).reshape(20, 3, 4, 4)
    assert chooser.forward("k", head, x).equal(x * 2)
    kept, chunk = chooser.known("k"), chooser.chunk("k")
    probe = layout.PROBE_SAMPLES
    runs = 1 + layout._TIMED_RUNS
    assert sizes[: 1 + 2 * runs] == [(1, False)] + [(probe, False)] * runs + [(probe, True)] * runs
    final = [(len(part), kept) for part in x.split(chunk or len(x))]
    assert sizes[-len(final) :] == final
    assert all(n <= probe for n, _ in sizes[: -len(final)])  # the slices timed on the probe


def test_a_heavy_head_is_timed_on_fewer_samples_and_no_slices() -> None:
    assert layout.probe_samples(0.001, 20) == layout.PROBE_SAMPLES
    assert layout.probe_samples(0.001, 3) == 3
    assert layout.probe_samples(layout.PROBE_FORWARD_S / 2, 20) == 2
    assert layout.probe_samples(0.4, 20) == 1  # ViT-B/16's whole head on a CPU core
    assert layout.probe_samples(0.0, 20) == layout.PROBE_SAMPLES


def test_a_head_slower_than_the_probe_budget_is_timed_on_one_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(layout, "PROBE_FORWARD_S", 0.0)  # any head is too heavy
    sizes: list[int] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        sizes.append(len(x))
        return x * 2

    chooser = LayoutChooser()
    x = torch.arange(20 * 3 * 4 * 4, dtype=torch.float32).reshape(20, 3, 4, 4)
    assert chooser.forward("k", head, x).equal(x * 2)
    runs = 1 + layout._TIMED_RUNS
    assert sizes == [1] * (1 + 2 * runs) + [20]  # no slice size timed: the batch runs whole
    assert chooser.chunk("k") is None


# The slice size per forward (CPU): a head's activations outgrow the caches as the batch grows.


def _chunk_timings(monkeypatch: pytest.MonkeyPatch, fastest: int | None) -> list[int]:
    """Both layouts alike; a forward of ``fastest`` samples 4x faster per sample than others."""
    timed: list[int] = []

    def fake(
        head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        sizes: list[int] = []

        def recording(t: torch.Tensor) -> torch.Tensor:
            sizes.append(len(t))
            return _double(t)

        y = head(x) if head is _double else _with(head, recording)(x)
        timed.append(1)
        per_sample = 0.25 if sizes and set(sizes) == {fastest} else 1.0
        return per_sample * len(x), y

    monkeypatch.setattr(layout, "_timed", fake)
    return timed


def _with(
    chunked: Callable[[torch.Tensor], torch.Tensor], head: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``chunked`` (a partial of run_in_chunks over the chooser's head) over ``head`` instead."""
    assert isinstance(chunked, functools.partial)
    return functools.partial(chunked.func, head, *chunked.args[1:], **chunked.keywords)


BATCH = torch.arange(20 * 3 * 2 * 2, dtype=torch.float32).reshape(20, 3, 2, 2)


def test_a_cpu_head_runs_in_the_slices_that_timed_fastest_and_a_restart_keeps_them(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chunk_timings(monkeypatch, fastest=4)
    chooser = LayoutChooser(persist=True)
    assert chooser.forward(KEY, _double, BATCH).equal(BATCH * 2)
    assert chooser.chunk(KEY) == 4
    sizes: list[int] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        sizes.append(len(x))
        return x * 2

    timed = _chunk_timings(monkeypatch, fastest=1)
    restarted = LayoutChooser(persist=True)
    assert restarted.forward(KEY, head, BATCH).equal(BATCH * 2)
    assert timed == [] and restarted.chunk(KEY) == 4 and sizes == [4] * 5


def test_no_slice_that_wins_by_the_margin_keeps_the_batch_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _chunk_timings(monkeypatch, fastest=None)
    chooser = LayoutChooser()
    chooser.forward(KEY, _double, BATCH)
    assert chooser.known(KEY) is not None and chooser.chunk(KEY) is None


def test_a_kept_choice_with_a_bad_slice_size_is_timed_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chunk_timings(monkeypatch, fastest=4)
    LayoutChooser(persist=True).forward(KEY, _double, BATCH)
    for path in cache.glob("*.json"):
        path.write_text(path.read_text().replace('"chunk": 4', '"chunk": 0'))
    timed = _chunk_timings(monkeypatch, fastest=4)
    again = LayoutChooser(persist=True)
    again.forward(KEY, _double, BATCH)
    assert timed and again.chunk(KEY) == 4


@pytest.mark.parametrize(("arch", "split"), [("efficientnet_lite0", 9), ("resnet18", 6)])
def test_a_head_in_slices_gives_the_batchs_features(arch: str, split: int) -> None:
    torch.manual_seed(0)
    head = hapi_models.get_model(arch, num_classes=10).eval().head(split)
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(run_in_chunks(head, x, 4), head(x), **CLOSE)
        assert run_in_chunks(head, x, None).equal(head(x))
