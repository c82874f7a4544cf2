"""Datasets indexed in place through the filter, in both executions (real proxy, real Swift).

A request goes to the shard's own URL: a folder dataset's part (beside its manifest) or a
WebDataset tar (in the data container). The filter authorises that object as the caller; the
images of a part are then read as the caller too (by the HAPI server, or by GET subrequests in
the proxy), so Swift's ACLs decide for each of them. A client fine-tunes on a folder dataset
through the filter (``via="swift"``) as through the server.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hapi_models
import pytest
import torch
from swiftclient.client import Connection

from hapi_client import (
    FeatureDataset,
    HapiClient,
    OptimizerConfig,
    ServerError,
    StoredModel,
    SwiftCredentials,
)
from hapi_client.datasets import index_dataset
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_contract import OutputDtype
from hapi_stack import RunningStack
from tests.hapi_server.conftest import ServerProcess
from tests.in_place_data import InPlace, put_folder_dataset, webdataset_tar
from tests.swift_middleware.mw_support import (
    MW_MODELS,
    MwData,
    ProxyProcess,
    extract,
    shard_url,
)

pytestmark = pytest.mark.swift

WDS_SHARD = "wds/shard-0000.tar"
EXECUTIONS = ("decoupled", "in_proxy")


def _unique(tag: str) -> str:
    return f"mw-inplace-{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def folder(swift_stack: RunningStack, mw_data: MwData) -> Iterator[InPlace]:
    """The filter tests' 12 images as single objects in parts of 5 (5, 5, 2), and as a
    WebDataset tar in the same data container."""
    conn = swift_stack.connection()
    data = put_folder_dataset(
        conn, _unique("index"), _unique("images"), mw_data.images, mw_data.labels, part_size=5
    )
    tar = webdataset_tar(mw_data.images, mw_data.labels, label_field="label")
    conn.put_object(data.data, WDS_SHARD, tar)
    conn.close()
    yield data


@pytest.fixture(params=EXECUTIONS)
def proxy(
    request: pytest.FixtureRequest, decoupled_proxy: ProxyProcess, in_proxy_proxy: ProxyProcess
) -> ProxyProcess:
    return decoupled_proxy if request.param == "decoupled" else in_proxy_proxy


def _client(swift_stack: RunningStack, mw_server: ServerProcess, proxy: ProxyProcess) -> HapiClient:
    """A client whose storage URL is ``proxy``'s: its requests go through the filter."""
    auth_url = swift_stack.auth_url.replace(swift_stack.proxy_url, proxy.url)
    creds = SwiftCredentials(auth_url, swift_stack.admin_user, swift_stack.admin_key)
    return HapiClient(mw_server.url, creds, via="swift")


def _resnet18(swift_conn: Connection, mw_data: MwData) -> StoredModel:
    """The filter tests' resnet18 weights (3 classes) as a stored model, without a descriptor."""
    obj, sha = mw_data.weights["resnet18"]
    size = int(swift_conn.head_object(MW_MODELS, obj)["content-length"])
    return StoredModel("resnet18", 3, MW_MODELS, obj, sha, size)


def _body(mw_data: MwData, folder: InPlace, **extra: Any) -> dict[str, Any]:
    body = mw_data.body("resnet18", 4, output_dtype="float32", b_max=4)
    body.update(layout="folder", data_container=folder.data, **extra)
    return body


# Requests may run at other COS batch sizes: float32 sums in another order.
CLOSE: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-5}


def test_folder_parts_give_the_uploaded_shards_features(
    proxy: ProxyProcess, mw_data: MwData, folder: InPlace
) -> None:
    whole = extract(
        shard_url(proxy), mw_data.body("resnet18", 4, output_dtype="float32"), mw_data.headers()
    )
    assert whole.status == 200, whole.body
    features, labels = [], []
    for part in folder.parts:
        got = extract(
            shard_url(proxy, folder.index, part), _body(mw_data, folder), mw_data.headers()
        )
        assert got.status == 200, got.body
        features.append(got.features())
        labels += got.labels()
    assert labels == mw_data.labels
    torch.testing.assert_close(torch.cat(features), whole.features(), **CLOSE)


def test_a_webdataset_tar_gives_the_uploaded_shards_features(
    proxy: ProxyProcess, mw_data: MwData, folder: InPlace
) -> None:
    whole = extract(
        shard_url(proxy), mw_data.body("resnet18", 4, output_dtype="float32"), mw_data.headers()
    )
    body = mw_data.body(
        "resnet18", 4, output_dtype="float32", layout="webdataset", label_field="label"
    )
    got = extract(shard_url(proxy, folder.data, WDS_SHARD), body, mw_data.headers())
    assert got.status == 200, got.body
    assert got.labels() == mw_data.labels
    torch.testing.assert_close(got.features(), whole.features(), **CLOSE)


def _mutable(swift_stack: RunningStack, mw_data: MwData, tag: str, count: int = 3) -> InPlace:
    """The first ``count`` images of the filter tests in a fresh folder dataset, one part."""
    conn = swift_stack.connection()
    try:
        return put_folder_dataset(
            conn,
            _unique(f"{tag}-index"),
            _unique(f"{tag}-images"),
            mw_data.images[:count],
            mw_data.labels[:count],
            part_size=count,
        )
    finally:
        conn.close()


def _error(got: Any) -> dict[str, Any]:
    detail: dict[str, Any] = json.loads(got.body)
    return detail


def test_an_image_overwritten_after_indexing_is_a_409_naming_it(
    proxy: ProxyProcess,
    mw_data: MwData,
    folder: InPlace,
    swift_stack: RunningStack,
    swift_conn: Connection,
) -> None:
    changed = _mutable(swift_stack, mw_data, "changed")
    swift_conn.put_object(changed.data, changed.names[2], mw_data.images[7])
    url = shard_url(proxy, changed.index, changed.parts[0])
    got = extract(url, _body(mw_data, changed), mw_data.headers())
    assert got.status == 409, got.body
    error = _error(got)
    assert error["code"] == "object_changed"
    assert f"{changed.data}/{changed.names[2]}" in error["detail"]
    # Served on: the unchanged dataset still works through the same proxy.
    ok = extract(
        shard_url(proxy, folder.index, folder.parts[-1]), _body(mw_data, folder), mw_data.headers()
    )
    assert ok.status == 200 and ok.labels() == mw_data.labels[10:]


def test_a_second_user_reads_the_images_only_with_a_read_acl(
    proxy: ProxyProcess, mw_data: MwData, swift_stack: RunningStack, swift_conn: Connection
) -> None:
    shared = _mutable(swift_stack, mw_data, "acl")
    reader = swift_stack.other_user
    url = shard_url(proxy, shared.index, shared.parts[0])
    body = _body(mw_data, shared)
    headers = mw_data.headers(mw_data.other_token)
    # No ACL at all: the filter's own authorisation of the part refuses.
    assert extract(url, body, headers).status == 403
    swift_conn.post_container(shared.index, {"X-Container-Read": reader})
    swift_conn.post_container(MW_MODELS, {"X-Container-Read": reader})
    try:
        # The part may be read, its images not: refused naming the image, not served.
        got = extract(url, body, headers)
        assert got.status == 403, got.body
        assert f"{shared.data}/img/" in _error(got)["detail"]
        swift_conn.post_container(shared.data, {"X-Container-Read": reader})
        got = extract(url, body, headers)
        assert got.status == 200, got.body
        assert got.labels() == mw_data.labels[:3]
    finally:
        swift_conn.post_container(MW_MODELS, {"X-Container-Read": ""})


def test_refused_image_reads_leave_the_proxy_serving_every_caller(
    proxy: ProxyProcess, mw_data: MwData, swift_stack: RunningStack, swift_conn: Connection
) -> None:
    """A part whose images may not be read is refused at its first image, while the other
    reads are in flight (their container lookups in memcached among them). Those must be left
    to finish: a read cut short inside Swift's pipeline kept its memcached connection, and once
    the proxy's pool was gone every token check timed out, a 401 to every caller."""
    many = _mutable(swift_stack, mw_data, "refused", count=len(mw_data.images))
    reader = swift_stack.other_user
    url = shard_url(proxy, many.index, many.parts[0])
    body = _body(mw_data, many)
    swift_conn.post_container(many.index, {"X-Container-Read": reader})
    swift_conn.post_container(MW_MODELS, {"X-Container-Read": reader})
    try:
        for round_ in range(6):
            # A new ACL on the images drops their container's cached info: every round's reads
            # look it up in memcached again, all at once.
            swift_conn.post_container(many.data, {"X-Container-Meta-Round": str(round_)})
            got = extract(url, body, mw_data.headers(mw_data.other_token))
            assert got.status == 403, got.body
        # Each refusal came once the reads in flight had finished, so a read ACL given now is
        # what the next request's reads see (none of the refused ones writes the old one back).
        swift_conn.post_container(many.data, {"X-Container-Read": reader})
        for token in (mw_data.other_token, mw_data.token):
            got = extract(url, body, mw_data.headers(token))
            assert got.status == 200, got.body
            assert got.labels() == mw_data.labels
    finally:
        swift_conn.post_container(MW_MODELS, {"X-Container-Read": ""})


#: The transform of the filter tests' requests (64-pixel images, ImageNet's statistics).
SIDE_64 = hapi_models.InputTransform(
    resize=64, crop=64, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
)


def test_a_client_fine_tunes_on_a_folder_dataset_through_the_filter(
    proxy: ProxyProcess,
    mw_data: MwData,
    folder: InPlace,
    swift_stack: RunningStack,
    swift_conn: Connection,
    mw_server: ServerProcess,
) -> None:
    stored = _resnet18(swift_conn, mw_data)
    whole = extract(
        shard_url(proxy), mw_data.body("resnet18", 4, output_dtype="float32"), mw_data.headers()
    )
    assert whole.status == 200, whole.body
    with _client(swift_stack, mw_server, proxy) as client:
        # One epoch of the dataset a training loop iterates: every sample exactly once, each
        # one's features those of the uploaded shard's image (a bijection, not a count).
        ds = FeatureDataset(
            client,
            folder.index,
            stored,
            batch_size=4,
            split=4,
            transform=SIDE_64,
            output_dtype="float32",
            cache_features=False,
            seed=2,
        )
        rows, labels = [], []
        for x, y in ds:
            rows.append(x.flatten(1))
            labels += y.tolist()
        assert ds.last_counters.samples == len(mw_data.labels)
        assert ds.last_counters.requests == len(folder.parts)  # one per part, none repeated
        got, expected = torch.cat(rows), whole.features().flatten(1)
        distance = torch.cdist(got.double(), expected.double())
        matched = distance.argmin(dim=1).tolist()
        assert sorted(matched) == list(range(len(mw_data.labels)))
        assert labels == [mw_data.labels[i] for i in matched]
        torch.testing.assert_close(got, expected[matched], **CLOSE)

        # The recipe on it: one epoch of HAPI at the same split.
        result = client.finetune(
            model=stored,
            container=folder.index,
            train=TrainOptions.with_optimizer(
                OptimizerConfig("sgd", lr=0.05), batch_size=4, epochs=1, seed=2
            ),
            extract=ExtractOptions(split=4, output_dtype=OutputDtype.FLOAT32),
            transform=SIDE_64,
            progress=False,
        )
    (epoch,) = result.history
    assert (epoch.samples, epoch.split_index, epoch.iterations) == (len(mw_data.labels), 4, 3)
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


def test_a_webdataset_tar_overwritten_after_indexing_is_a_409_naming_it(
    proxy: ProxyProcess,
    mw_data: MwData,
    swift_stack: RunningStack,
    swift_conn: Connection,
    mw_server: ServerProcess,
    tmp_path: Path,
) -> None:
    data = _unique("wds-changed")
    swift_conn.put_container(data)
    images, labels = mw_data.images[:3], mw_data.labels[:3]
    swift_conn.put_object(data, WDS_SHARD, webdataset_tar(images, labels, label_field="label"))
    index_dataset(
        swift_conn,
        data,
        layout="webdataset",
        label_field="label",
        state_dir=tmp_path,
        progress=False,
    )
    stored = _resnet18(swift_conn, mw_data)
    named = f"{data}/{WDS_SHARD} changed after it was indexed"
    # The same number of samples with other images, then fewer: each refused by its pin.
    for changed in (mw_data.images[3:6], mw_data.images[3:5]):
        tar = webdataset_tar(changed, labels[: len(changed)], label_field="label")
        swift_conn.put_object(data, WDS_SHARD, tar)
        with _client(swift_stack, mw_server, proxy) as client:
            ds = FeatureDataset(
                client,
                data,
                stored,
                batch_size=4,
                split=4,
                transform=SIDE_64,
                output_dtype="float32",
                cache_features=False,
            )
            with pytest.raises(ServerError, match=named) as refused:
                list(ds)
        assert refused.value.status == 409 and refused.value.code == "object_changed"
