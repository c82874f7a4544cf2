"""Unit tests of ``WeightsCache``: a model it drops leaves the process then, not at the next
full garbage collection.

A network cut at its torch.fx split points (every one not cut by hand) sits in reference
cycles, so dropping the last reference to it freed nothing until Python's next full
collection; the planner meanwhile counted its weights as memory outside the plan (issue 27:
a ConvNeXt-L evicted for a ViT-L/16 stayed resident and the ViT-L/16 was refused 507). The
automatic collector is off in these tests, as it is in effect between a long-lived proxy's
rare full collections.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import hapi_models
import pytest
import torch

from hapi_core.devices import Device
from hapi_core.weights_cache import CacheKey, WeightsCache

CPU = Device("cpu", 2**30)
KEY: CacheKey = ("0" * 64, "squeezenet1_1", 3, "cpu")


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _cached_idle(cache: WeightsCache, key: CacheKey = KEY) -> weakref.ref[torch.Tensor]:
    """A graph-split model that a request ran and released; a weak reference to a weight."""
    model = hapi_models.get_model("squeezenet1_1", num_classes=3)
    entry = cache.insert(key, model, etag="e")
    cache.acquire(entry)
    cache.release(entry)
    return weakref.ref(next(model.parameters()))


@pytest.mark.usefixtures("no_automatic_collection")
def test_an_evicted_graph_split_model_leaves_the_process() -> None:
    cache = WeightsCache(idle_budget_bytes=2**30)
    weight = _cached_idle(cache)
    assert weight() is not None  # cached while idle

    assert cache.evict_idle(CPU) > 0
    assert weight() is None


@pytest.mark.usefixtures("no_automatic_collection")
def test_a_model_trimmed_over_the_idle_budget_leaves_the_process() -> None:
    cache = WeightsCache(idle_budget_bytes=2**30)
    older = _cached_idle(cache)
    cache.idle_budget_bytes = cache.resident_bytes(CPU)  # room for one idle model
    newer = _cached_idle(cache, ("1" * 64, *KEY[1:]))  # its release trims the older

    assert cache.lookup(KEY) is None
    assert older() is None and newer() is not None


@pytest.mark.usefixtures("no_automatic_collection")
def test_a_model_still_held_at_its_eviction_is_reclaimed_once_let_go() -> None:
    cache = WeightsCache(idle_budget_bytes=2**30)
    weight = _cached_idle(cache)
    held = weight()  # a finished request's response, not yet let go
    cache.evict_idle(CPU)
    assert cache.reclaim() == 0 and weight() is not None

    nbytes = held.numel() * held.element_size() if held is not None else 0
    del held
    assert cache.reclaim() >= nbytes > 0
    assert weight() is None


@pytest.mark.usefixtures("no_automatic_collection")
def test_an_entry_still_held_at_its_eviction_keeps_no_model() -> None:
    cache = WeightsCache(idle_budget_bytes=2**30)
    weight = _cached_idle(cache)
    entry = cache.lookup(KEY)  # a finished request's, whose response is not yet let go
    cache.evict_idle(CPU)
    assert entry is not None and weight() is None
