"""Datasets indexed in place, written straight into the real Swift for the read-path tests.

The images go in as single objects (``folder``) or as one WebDataset tar whose members are in
an order and with names our own writer never uses (``webdataset``); the parts and the manifest
are written with the contract's own functions, so what a test pins is exactly what it wrote.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from swiftclient.client import Connection

from hapi_client.datasets import get_source, index_dataset
from hapi_contract import (
    MANIFEST_NAME,
    DatasetLayout,
    DatasetManifest,
    PartEntry,
    ShardInfo,
    md5_hex,
    part_name,
    write_part,
)


@dataclass(frozen=True)
class InPlace:
    """A folder dataset: its manifest's container, the images' container and their names."""

    index: str
    data: str
    names: list[str]
    manifest: DatasetManifest

    @property
    def parts(self) -> list[str]:
        return [s.name for s in self.manifest.shards]


def put_folder_dataset(
    conn: Connection,
    index: str,
    data: str,
    images: list[bytes],
    labels: list[int],
    *,
    part_size: int,
    classes: tuple[str, ...] = ("a", "b", "c"),
) -> InPlace:
    """Upload ``images`` one object each into ``data`` (``img/NNNN.jpg``) and index them in
    parts of ``part_size`` into ``index`` (parts and ``manifest.json``)."""
    conn.put_container(index)
    conn.put_container(data)
    names = [f"img/{i:04d}.jpg" for i in range(len(images))]
    for name, image in zip(names, images, strict=True):
        conn.put_object(data, name, image)
    shards = []
    for k, start in enumerate(range(0, len(images), part_size)):
        entries = [
            PartEntry(name=names[i], etag=md5_hex(images[i]), bytes=len(images[i]), label=labels[i])
            for i in range(start, min(start + part_size, len(images)))
        ]
        blob = write_part(entries)
        conn.put_object(index, part_name(k), blob)
        shards.append(
            ShardInfo(
                name=part_name(k),
                samples=len(entries),
                bytes=len(blob),
                etag=md5_hex(blob),
                first_index=start,
                image_bytes=sum(e.bytes for e in entries),
            )
        )
    manifest = DatasetManifest.build(
        name=index,
        classes=classes,
        shards=shards,
        shard_size=part_size,
        layout=DatasetLayout.FOLDER,
        data_container=data,
    )
    conn.put_object(index, MANIFEST_NAME, manifest.to_json())
    return InPlace(index, data, names, manifest)


def index_photos_in_place(
    conn: Connection, spec: str, data: str, index: str, *, part_size: int, state_dir: Path
) -> DatasetManifest:
    """The images of source ``spec`` one object each into ``data``
    (``train/<class>/<NNNN>.<ext>``), indexed in place with ``hapi_client.index_dataset`` into
    ``index`` in parts of ``part_size``: a dataset as a user brings it."""
    conn.put_container(data)
    source = get_source(spec)
    for i, (image, ext, label) in enumerate(source):
        conn.put_object(data, f"train/{source.classes[label]}/{i:04d}.{ext}", image)
    return index_dataset(
        conn,
        data,
        layout="folder",
        prefix="train",
        into=index,
        shard_size=part_size,
        state_dir=state_dir,
        progress=False,
    )


def webdataset_tar(images: list[bytes], labels: list[int], *, label_field: str) -> bytes:
    """A tar as third-party tooling writes one: per sample the ``.json`` (label in
    ``label_field``) before a ``.jpeg`` image, an extra caption member, keys with directories."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            key = f"train/sample_{i:05d}"
            members = [
                (f"{key}.json", json.dumps({label_field: label, "source": "test"}).encode()),
                (f"{key}.txt.caption", b"a caption the reader skips"),
                (f"{key}.jpeg", image),
            ]
            for name, payload in members:
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()
