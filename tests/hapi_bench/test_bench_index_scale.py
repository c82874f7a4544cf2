"""``benchmarks/index_scale.py`` runs the in-place indexer over its synthetic listing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hapi_bench.index_scale import SyntheticStore, measure


@pytest.mark.parametrize("labels", [False, True])
def test_measure_indexes_every_synthetic_image(tmp_path: Path, labels: bool) -> None:
    report = measure(20_001, 7, labels=labels, state_dir=tmp_path)
    assert (report["images"], report["classes"], report["parts"]) == (20_001, 7, 21)
    assert report["listing_pages"] == 3  # 10,000 names a page, as Swift lists them
    assert not tmp_path.exists()  # the state is cleared once the manifest is written


def test_the_synthetic_listing_continues_from_its_marker() -> None:
    store = SyntheticStore(images=25, classes=3)
    first = store.list_page("c", "train/", "", 10)
    rest = store.list_page("c", "train/", first[-1].name, 100)
    names = [e.name for e in first + rest]
    assert len(names) == 25 and names == sorted(set(names))
