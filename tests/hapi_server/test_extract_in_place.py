"""POST /v1/extract over datasets indexed in place (folder parts, WebDataset tars), real HTTP.

The same images as the session's uploaded shard, as single objects and as a third-party tar,
give the same features; an image changed, deleted, or not an image after indexing is a 4xx
naming it, and the server keeps serving; a second user reads them only with a read ACL.
"""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from swiftclient.client import Connection

from hapi_contract import RemoteStreamError
from hapi_stack import RunningStack
from tests.in_place_data import InPlace, put_folder_dataset, webdataset_tar

from .conftest import DATA, MODELS, Dataset, ServerProcess
from .server_helpers import assert_error, extract, post

pytestmark = pytest.mark.swift

SHARD = "shards/shard-000000.tar"
ARCH, SPLIT = "resnet18", 4
WDS_SHARD = "wds/train-0000.tar"
WDS_GZ_SHARD = "wds/train-0001.tar.gz"  # the same tar, gzip-compressed


def _unique(tag: str) -> str:
    return f"inplace-{tag}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Data:
    folder: InPlace
    images: list[bytes]
    labels: list[int]


@pytest.fixture(scope="module")
def data(swift_stack: RunningStack, dataset: Dataset) -> Iterator[Data]:
    """The uploaded shard's 20 images as single objects in parts of 8 (8, 8, 4), and as a
    WebDataset tar in the same data container."""
    images, labels = dataset.shards[SHARD]
    conn = swift_stack.connection()
    folder = put_folder_dataset(
        conn, _unique("index"), _unique("images"), images, labels, part_size=8
    )
    tar = webdataset_tar(images, labels, label_field="cls_id")
    conn.put_object(folder.data, WDS_SHARD, tar)
    conn.put_object(folder.data, WDS_GZ_SHARD, gzip.compress(tar))
    conn.close()
    yield Data(folder, images, labels)


def _folder_body(
    dataset: Dataset, folder: InPlace, part: str, **extra: object
) -> dict[str, object]:
    body = dataset.request(ARCH, part, SPLIT, output_dtype="float32", **extra)
    body.update(container=folder.index, layout="folder", data_container=folder.data)
    return body


def _reference(hapi_server: ServerProcess, dataset: Dataset) -> torch.Tensor:
    body = dataset.request(ARCH, SHARD, SPLIT, output_dtype="float32")
    return torch.cat([f.features for f in extract(hapi_server, dataset, body).frames])


# Two requests may run at other COS batch sizes: float32 sums in another order.
CLOSE = {"rtol": 1e-4, "atol": 1e-5}


def test_folder_parts_give_the_features_of_the_uploaded_shard(
    hapi_server: ServerProcess, dataset: Dataset, data: Data
) -> None:
    whole = _reference(hapi_server, dataset)
    got, labels = [], []
    for part in data.folder.parts:
        result = extract(hapi_server, dataset, _folder_body(dataset, data.folder, part))
        got += [f.features for f in result.frames]
        labels += result.labels
        assert result.end.meta["server_ms"]["read"] > 0
    assert labels == data.labels
    torch.testing.assert_close(torch.cat(got), whole, **CLOSE)


@pytest.mark.parametrize("shard", [WDS_SHARD, WDS_GZ_SHARD])
def test_a_webdataset_tar_gives_the_features_of_the_uploaded_shard(
    hapi_server: ServerProcess, dataset: Dataset, data: Data, shard: str
) -> None:
    # A .tar.gz is planned from its gzip trailer, read by a ranged GET (issue 27).
    body = dataset.request(ARCH, shard, SPLIT, output_dtype="float32")
    body.update(container=data.folder.data, layout="webdataset", label_field="cls_id")
    result = extract(hapi_server, dataset, body)
    assert result.labels == data.labels
    features = torch.cat([f.features for f in result.frames])
    torch.testing.assert_close(features, _reference(hapi_server, dataset), **CLOSE)
    # Read strictly, the same tar is refused by name: the layout is what the request says.
    body.pop("label_field")
    body["layout"] = "shards"
    detail = assert_error(post(hapi_server, body, dataset.headers()), 422, "invalid_shard").detail
    assert shard in detail


def _mutable(swift_stack: RunningStack, data: Data, tag: str) -> InPlace:
    """A folder dataset of its own (3 images, one part) that a test may change."""
    conn = swift_stack.connection()
    try:
        return put_folder_dataset(
            conn,
            _unique(f"{tag}-index"),
            _unique(f"{tag}-images"),
            data.images[:3],
            data.labels[:3],
            part_size=3,
        )
    finally:
        conn.close()


def _still_serving(hapi_server: ServerProcess, dataset: Dataset, data: Data) -> None:
    part = data.folder.parts[-1]
    result = extract(hapi_server, dataset, _folder_body(dataset, data.folder, part))
    assert result.end.samples == 4


@pytest.mark.parametrize("change", ["overwritten", "emptied", "deleted"])
def test_an_image_changed_after_indexing_is_a_409_naming_it(
    change: str,
    hapi_server: ServerProcess,
    dataset: Dataset,
    data: Data,
    swift_stack: RunningStack,
    swift_conn: Connection,
) -> None:
    folder = _mutable(swift_stack, data, change)
    name = folder.names[1]
    if change == "overwritten":
        swift_conn.put_object(folder.data, name, data.images[5])  # another real image
    elif change == "emptied":
        swift_conn.put_object(folder.data, name, b"")
    else:
        swift_conn.delete_object(folder.data, name)
    body = _folder_body(dataset, folder, folder.parts[0])
    error = assert_error(post(hapi_server, body, dataset.headers()), 409, "object_changed")
    assert f"{folder.data}/{name}" in error.detail
    assert ("deleted" if change == "deleted" else "changed after it was indexed") in error.detail
    _still_serving(hapi_server, dataset, data)


def test_an_object_that_is_not_an_image_is_a_422_naming_it(
    hapi_server: ServerProcess,
    dataset: Dataset,
    data: Data,
    swift_stack: RunningStack,
    swift_conn: Connection,
) -> None:
    not_an_image = b"just some text, indexed as if it were a JPEG\n" * 4
    conn = swift_stack.connection()
    try:
        folder = put_folder_dataset(
            conn,
            _unique("text-index"),
            _unique("text-images"),
            [data.images[0], not_an_image],
            [0, 1],
            part_size=2,
        )
    finally:
        conn.close()
    body = _folder_body(dataset, folder, folder.parts[0])
    error = assert_error(post(hapi_server, body, dataset.headers()), 422, "invalid_shard")
    assert f"{folder.data}/{folder.names[1]}" in error.detail and "not" in error.detail
    _still_serving(hapi_server, dataset, data)


def test_a_truncated_image_is_a_422_naming_its_object(
    hapi_server: ServerProcess, dataset: Dataset, data: Data, swift_stack: RunningStack
) -> None:
    """Its header opens (the checks before the stream pass), its body does not decode: the
    error frame names the image object, not "cannot decode image" alone (issue 28, case 6)."""
    cut = data.images[1][: len(data.images[1]) // 2]
    conn = swift_stack.connection()
    try:
        folder = put_folder_dataset(
            conn,
            _unique("cut-index"),
            _unique("cut-images"),
            [data.images[0], cut],
            [0, 1],
            part_size=2,
        )
    finally:
        conn.close()
    body = _folder_body(dataset, folder, folder.parts[0], b_max=1)
    with pytest.raises(RemoteStreamError) as info:
        extract(hapi_server, dataset, body)
    assert info.value.status == 422
    assert f"{folder.data}/{folder.names[1]}: cannot decode image" in info.value.detail
    assert "truncated" in info.value.detail
    _still_serving(hapi_server, dataset, data)


def test_a_truncated_image_in_a_webdataset_tar_is_named_by_shard_and_key(
    hapi_server: ServerProcess, dataset: Dataset, data: Data, swift_conn: Connection
) -> None:
    cut = data.images[1][: len(data.images[1]) // 2]
    name = "wds/cut-0000.tar"
    tar = webdataset_tar([data.images[0], cut], [0, 1], label_field="cls_id")
    swift_conn.put_object(data.folder.data, name, tar)
    body = dataset.request(ARCH, name, SPLIT, b_max=1)
    body.update(container=data.folder.data, layout="webdataset", label_field="cls_id")
    with pytest.raises(RemoteStreamError) as info:
        extract(hapi_server, dataset, body)
    assert info.value.status == 422
    detail = info.value.detail
    assert f"shard {data.folder.data}/{name}: sample train/sample_00001: " in detail, detail
    _still_serving(hapi_server, dataset, data)


def test_a_part_that_is_not_a_part_is_a_422_naming_it(
    hapi_server: ServerProcess, dataset: Dataset, data: Data
) -> None:
    body = _folder_body(dataset, data.folder, SHARD)
    body.update(container=DATA)  # the uploaded tar, read as if it were a part
    error = assert_error(post(hapi_server, body, dataset.headers()), 422, "invalid_shard")
    assert SHARD in error.detail


def test_a_second_user_reads_the_images_only_with_a_read_acl(
    hapi_server: ServerProcess,
    dataset: Dataset,
    data: Data,
    swift_stack: RunningStack,
    swift_conn: Connection,
) -> None:
    folder = _mutable(swift_stack, data, "acl")
    other = swift_stack.connection(swift_stack.other_user, swift_stack.other_key, account="test")
    try:
        _, token = other.get_auth()
    finally:
        other.close()
    reader = swift_stack.other_user
    # The models and the part may be read; the images not yet.
    for container in (folder.index, MODELS):
        swift_conn.post_container(container, {"X-Container-Read": reader})
    headers = {"X-Auth-Token": token, "X-Storage-Url": swift_stack.account_url("test")}
    body = _folder_body(dataset, folder, folder.parts[0])
    try:
        error = assert_error(post(hapi_server, body, headers), 403, "forbidden")
        assert folder.data in error.detail and "img/" in error.detail
        swift_conn.post_container(folder.data, {"X-Container-Read": reader})
        resp = post(hapi_server, body, headers)
        assert resp.status_code == 200, resp.content[:300]
    finally:
        swift_conn.post_container(MODELS, {"X-Container-Read": ""})


def test_bad_layout_fields_are_a_422(
    hapi_server: ServerProcess, dataset: Dataset, data: Data
) -> None:
    for extra in (
        {"layout": "folder", "label_field": "cls"},
        {"layout": "webdataset", "data_container": data.folder.data},
        {"layout": "tree"},
        {"layout": "folder", "data_container": ".."},
    ):
        body = dataset.request(ARCH, data.folder.parts[0], SPLIT, **extra)
        assert_error(post(hapi_server, body, dataset.headers()), 422, "invalid_request")
