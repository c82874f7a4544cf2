"""Every mode on datasets indexed in place, against the real Swift and a real HAPI server.

The photos are put one object per image and indexed with ``hapi_client.datasets.index_dataset``
(the folder layout), and as a WebDataset tar (the webdataset layout); then HAPI, BASELINE and
ALL_IN_COS train on them as on an uploaded dataset: the same weights, every sample once per
epoch (resumed mid-epoch too), verified, cached, shared between ranks, split="auto".
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hapi_models
import pytest
import torch

from hapi_client import FeatureDataset, HapiClient, OptimizerConfig, ServerError
from hapi_client.datasets import get_source, index_dataset
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_client.shard_loaders import read_source
from hapi_contract import ChangedObjectError, DatasetLayout, DatasetManifest, ShardSource
from tests.in_place_data import index_photos_in_place, webdataset_tar

from .conftest import ClientEnv

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
OPT = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
MODEL = "efficientnet_lite0"
PER_CLASS = 3
PHOTOS = f"photos:train?per_class={PER_CLASS}&size=96x72"


def _unique(tag: str) -> str:
    return f"cl-inplace-{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def folder(client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The photos one object per image, indexed (parts of 8) into a container of their own."""
    conn = client_env.stack.connection()
    data, index = _unique("photos"), _unique("index")
    index_photos_in_place(
        conn, PHOTOS, data, index, part_size=8, state_dir=tmp_path_factory.mktemp("index-state")
    )
    conn.close()
    return index


@pytest.fixture(scope="module")
def client(client_env: ClientEnv) -> Iterator[HapiClient]:
    with client_env.client() as c:
        yield c


def _finetune(client: HapiClient, env: ClientEnv, container: str, mode: str, **kw: Any) -> Any:
    return client.finetune(
        model=env.models[MODEL].name,
        container=container,
        mode=mode,
        train=TrainOptions.with_optimizer(OPT, batch_size=8, epochs=1, seed=3),
        extract=ExtractOptions(split="freeze", **kw),
        transform=SMALL,
        progress=False,
    )


def test_the_three_modes_agree_on_a_folder_dataset(
    client_env: ClientEnv, client: HapiClient, folder: str
) -> None:
    manifest = client.manifest(folder)
    assert manifest.layout is DatasetLayout.FOLDER and len(manifest.shards) > 1
    hapi = _finetune(client, client_env, folder, "hapi", output_dtype="float32")
    base = _finetune(client, client_env, folder, "baseline")
    cos = _finetune(client, client_env, folder, "all_in_cos")
    assert hapi.history[0].samples == base.history[0].samples == manifest.num_samples
    assert hapi.history[0].split_index > 0 and base.history[0].split_index == 0
    a, b, c = (r.model.state_dict() for r in (hapi, base, cos))
    for k in b:
        # float32 features: equal to BASELINE's local ones up to summation order.
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
        torch.testing.assert_close(c[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    # BASELINE read the images themselves: what the parts pin, plus the parts.
    assert base.history[0].bytes_received >= sum(s.image_bytes for s in manifest.shards)


def _dataset(env: ClientEnv, client: HapiClient, container: str, **kw: Any) -> FeatureDataset:
    return FeatureDataset(
        client,
        container,
        env.models[MODEL].name,
        batch_size=8,
        split=kw.pop("split", "freeze"),
        transform=SMALL,
        seed=3,
        **kw,
    )


def _signature(batches: Any) -> list[tuple[list[int], float]]:
    return [(y.tolist(), float(x.double().sum())) for x, y in batches]


def _stored_labels(client: HapiClient, manifest: DatasetManifest, container: str) -> list[int]:
    labels: list[int] = []
    for k in range(len(manifest.shards)):
        samples, _ = read_source(client.swift, ShardSource.of(manifest, container, k))
        labels += [s.label for s in samples]
    return labels


def test_feature_dataset_on_a_folder_dataset_delivers_each_sample_once_and_resumes(
    client_env: ClientEnv, client: HapiClient, folder: str
) -> None:
    manifest = client.manifest(folder)
    expected = collections.Counter(_stored_labels(client, manifest, folder))
    whole_ds = _dataset(client_env, client, folder, verify_fraction=1.0)
    whole = _signature(whole_ds)
    assert collections.Counter(y for ys, _ in whole for y in ys) == expected
    assert whole_ds.verifier is not None
    assert whole_ds.verifier.checked_shards == len(manifest.shards)
    # Epoch two comes from the feature cache (keyed by the part's etag, which pins its images).
    second = _signature(whole_ds)
    assert whole_ds.last_counters.requests == 0 and len(second) == len(whole)

    # The client stops mid-epoch; a new one resumes from the saved state: nothing lost or
    # repeated, the same features in the same order.
    first = _dataset(client_env, client, folder, cache_features=False)
    head = []
    for batch in first:
        head.append(batch)
        if len(head) == 2:
            break
    state = first.state_dict()
    del first
    resumed = _dataset(client_env, client, folder, cache_features=False)
    resumed.load_state_dict(state)
    got = _signature(head) + _signature(resumed)
    assert [y for y, _ in got] == [y for y, _ in whole]
    for (_, a), (_, b) in zip(got, whole, strict=True):
        assert a == pytest.approx(b, rel=1e-5)


def test_two_ranks_share_a_folder_dataset(
    client_env: ClientEnv, client: HapiClient, folder: str
) -> None:
    manifest = client.manifest(folder)
    ranks = [_dataset(client_env, client, folder, rank=r, world_size=2) for r in (0, 1)]
    labels: collections.Counter[int] = collections.Counter()
    for ds in ranks:
        for _, y in ds:
            labels.update(y.tolist())
    assert len(ranks[0]) == len(ranks[1])
    assert labels == collections.Counter(_stored_labels(client, manifest, folder))


def test_split_auto_plans_over_a_folder_dataset(
    client_env: ClientEnv, client: HapiClient, folder: str
) -> None:
    ds = _dataset(client_env, client, folder, split="auto")
    assert 0 <= ds.split_index <= ds.freeze_index
    assert sum(len(y) for _, y in ds) == client.manifest(folder).num_samples


def test_a_webdataset_dataset_trains_like_an_uploaded_one(
    client_env: ClientEnv, client: HapiClient, tmp_path: Path
) -> None:
    conn = client_env.stack.connection()
    data = _unique("wds")
    conn.put_container(data)
    source = get_source(PHOTOS)
    samples = [(image, label) for image, _, label in source]
    half = len(samples) // 2
    for k, chunk in enumerate((samples[:half], samples[half:])):
        tar = webdataset_tar([s[0] for s in chunk], [s[1] for s in chunk], label_field="y")
        conn.put_object(data, f"shards/train-{k:04d}.tar", tar)
    manifest = index_dataset(
        conn, data, layout="webdataset", label_field="y", state_dir=tmp_path, progress=False
    )
    conn.close()
    assert manifest.layout is DatasetLayout.WEBDATASET and len(manifest.shards) == 2
    hapi = _finetune(client, client_env, data, "hapi", output_dtype="float32")
    base = _finetune(client, client_env, data, "baseline")
    assert hapi.history[0].samples == base.history[0].samples == len(samples)
    for k, v in base.model.state_dict().items():
        torch.testing.assert_close(hapi.model.state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=k)


def test_an_image_changed_after_indexing_is_named_in_every_mode(
    client_env: ClientEnv, client: HapiClient, tmp_path: Path
) -> None:
    conn = client_env.stack.connection()
    data, index = _unique("changing"), _unique("changing-index")
    manifest = index_photos_in_place(conn, PHOTOS, data, index, part_size=64, state_dir=tmp_path)
    _, listing = conn.get_container(data, prefix="train/")
    victim = listing[3]["name"]
    _, image = conn.get_object(data, victim)
    conn.put_object(data, victim, image + b"\0")  # still a JPEG, no longer the one indexed
    conn.close()
    assert len(manifest.shards) == 1
    with pytest.raises(ServerError) as refused:
        list(_dataset(client_env, client, index, cache_features=False))
    assert refused.value.status == 409 and refused.value.code == "object_changed"
    assert f"{data}/{victim}" in refused.value.detail
    with pytest.raises(ChangedObjectError, match=f"{data}/{victim}"):
        list(_dataset(client_env, client, index, mode="baseline"))


def test_a_webdataset_shard_overwritten_after_indexing_is_named_in_every_mode(
    client_env: ClientEnv, client: HapiClient, tmp_path: Path
) -> None:
    conn = client_env.stack.connection()
    data = _unique("wds-changing")
    conn.put_container(data)
    source = get_source(PHOTOS)
    samples = [(image, label) for image, _, label in source]
    half = len(samples) // 2
    chunks = (samples[:half], samples[half:])
    for k, chunk in enumerate(chunks):
        tar = webdataset_tar([s[0] for s in chunk], [s[1] for s in chunk], label_field="y")
        conn.put_object(data, f"shards/train-{k:04d}.tar", tar)
    index_dataset(
        conn, data, layout="webdataset", label_field="y", state_dir=tmp_path, progress=False
    )
    victim = "shards/train-0000.tar"
    # As many samples as indexed, other images: only the pinned etag can tell.
    swapped = [s[0] for s in chunks[1][:half]]
    conn.put_object(
        data, victim, webdataset_tar(swapped, [s[1] for s in chunks[0]], label_field="y")
    )
    named = f"{data}/{victim} changed after it was indexed"
    for attempt in (
        lambda: list(_dataset(client_env, client, data, cache_features=False)),
        lambda: _finetune(client, client_env, data, "all_in_cos"),
    ):
        with pytest.raises(ServerError) as refused:
            attempt()
        assert refused.value.status == 409 and refused.value.code == "object_changed"
        assert named in refused.value.detail
    with pytest.raises(ChangedObjectError, match=named):
        list(_dataset(client_env, client, data, mode="baseline"))
    # Fewer samples than indexed: the same refusal, not a count that does not add up.
    fewer = chunks[0][:-1]
    conn.put_object(
        data,
        victim,
        webdataset_tar([s[0] for s in fewer], [s[1] for s in fewer], label_field="y"),
    )
    conn.close()
    with pytest.raises(ServerError, match=named) as refused:
        list(_dataset(client_env, client, data, cache_features=False))
    assert refused.value.code == "object_changed"
    with pytest.raises(ChangedObjectError, match=named):
        list(_dataset(client_env, client, data, mode="baseline"))
