"""``benchmarks/index_scale.py`` runs the in-place indexer over its synthetic listing, then a
client's start of an epoch over the manifest it built."""

from __future__ import annotations

from pathlib import Path

import pytest
from hapi_bench.index_scale import (
    LocalManifestConnection,
    SyntheticStore,
    client_report,
    goals,
    measure,
    measure_client,
)
from swiftclient.exceptions import ClientException

from hapi_client.datasets import load_manifest


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


def test_the_client_plans_an_epoch_over_the_built_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    report = measure(20_001, 7, labels=False, state_dir=tmp_path / "state", manifest_out=manifest)
    assert manifest.stat().st_size == report["manifest_bytes"]
    client = measure_client(manifest, batch_size=256)
    assert client["client_samples"] == 20_001
    assert client["client_batches"] == 79  # ceil(20,001 / 256)
    assert str(client["client_first_request"]).startswith("imagenet-index/hapi-index/part-")
    for key in (
        "client_manifest_bytes",
        "client_seconds_manifest",
        "client_seconds_to_first_request",
        "client_rss_before_mib",
        "client_peak_rss_mib",
    ):
        value = client[key]
        assert isinstance(value, int | float) and value > 0, key


def test_the_client_side_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    report = measure(3_000, 3, labels=False, state_dir=tmp_path / "state", manifest_out=manifest)
    report |= client_report(manifest, batch_size=100)
    assert report["client_samples"] == 3_000
    for key in ("client_seconds_to_first_request", "client_peak_rss_mib", "client_seconds_process"):
        value = report[key]
        assert isinstance(value, int | float) and value > 0, key
    checked = goals(report)
    assert set(checked) == {
        "index_peak_rss_mib",
        "client_seconds_to_first_request",
        "client_peak_rss_mib",
    }
    for goal in checked.values():
        assert isinstance(goal, dict) and {"measured", "goal", "met"} <= goal.keys()


def test_the_local_connection_serves_only_the_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    measure(1_000, 2, labels=False, state_dir=tmp_path / "state", manifest_out=manifest)
    conn = LocalManifestConnection(manifest)
    assert load_manifest(conn, "imagenet-index").num_samples == 1_000
    with pytest.raises(ClientException) as missing:
        conn.get_object("imagenet-index", "hapi-index/part-000000.jsonl")
    assert missing.value.http_status == 404
