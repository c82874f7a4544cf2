"""``hapi dataset index``: index data already in Swift, in place (nothing is copied).

The manifest goes into ``--into`` (default: the data container) as ``manifest.json``; the
dataset is then named by that container everywhere a dataset is named (``hapi finetune
--dataset``), exactly like one uploaded with ``hapi upload dataset``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hapi_contract.dataset import DEFAULT_SHARD_SIZE, DatasetLayout

from .parsers import RawDescriptionDefaultsHelpFormatter
from .upload_cmd import connect, swift_options

if TYPE_CHECKING:  # imported when the command runs: `hapi --help` stays fast
    from hapi_client.datasets import IndexRequest

__all__ = ["register"]

#: Skipped names the summary prints (the manifest keeps more).
_SHOWN_SKIPPED = 10

_LAYOUTS = sorted(str(layout) for layout in DatasetLayout if layout is not DatasetLayout.SHARDS)

_EPILOG = """\
Layouts:
  folder      one object per image: PREFIX<class>/**/<name>.jpg|jpeg|png|webp (any case), or
              the objects a --labels object names (CSV "name,class" or JSON Lines
              {"name": ..., "class": ...}; names are full object names). Classes are sorted by
              name, as torchvision's ImageFolder sorts them. Other objects (README.txt,
              Thumbs.db) and hidden ones (.DS_Store, ._a.jpg, .thumbnails/) are skipped, counted
              and named in the summary and the manifest, or refused with --strict. The images
              are dealt into part objects of --shard-size images (hapi-index/part-NNNNNN.jsonl
              beside the manifest).
  webdataset  existing WebDataset shards PREFIX**.tar|.tar.gz|.tgz (other objects are
              skipped, or refused with --strict), read once to count their samples; labels from each sample's .cls or
              .txt member, or the --label-field of its .json member.
Nothing in the data container is written, moved or rewritten; every object's ETag and size is
pinned in the manifest, so a change after indexing is named when the data is read. An
interrupted run continues where it stopped when run again with the same options.
Example: hapi dataset index --container photos --prefix train/ --layout folder --into photos-idx"""


def _index(args: argparse.Namespace) -> int:
    from hapi_client.datasets import IndexRequest, sync_index

    request = IndexRequest(
        container=args.container,
        layout=DatasetLayout(args.layout),
        prefix=args.prefix,
        labels=args.labels,
        label_field=args.label_field,
        into=args.into,
        shard_size=args.shard_size,
        strict=args.strict,
    )
    conn = connect(args)
    try:
        progress = sys.stderr.isatty() if args.progress is None else args.progress
        result = sync_index(conn, request, state_dir=args.state_dir, progress=progress)
    finally:
        conn.close()
    manifest = result.manifest
    units = "parts" if manifest.layout is DatasetLayout.FOLDER else "shards"
    print(
        f"dataset {manifest.name!r} ({manifest.layout} layout, data in "
        f"{manifest.data_location!r}): {manifest.num_samples} samples, "
        f"{manifest.num_classes} classes, {len(manifest.shards)} {units}, "
        f"{manifest.total_bytes / 1e6:.1f} MB of data"
    )
    print(
        f"  listed {result.objects_listed} objects, skipped {result.objects_skipped}; wrote "
        f"{result.parts_written} parts, manifest "
        f"{'written' if result.manifest_written else 'unchanged'}, "
        f"{len(result.stale_deleted)} stale parts deleted"
        + ("; continued an interrupted run" if result.resumed else "")
    )
    if result.objects_skipped:
        print(f"  {_skipped_line(result.objects_skipped, result.skipped_examples, request)}")
    print(f"  {result.seconds:.1f} s")
    return 0


def _skipped_line(count: int, examples: tuple[str, ...], request: IndexRequest) -> str:
    """What the index left out, named (the manifest keeps the same names)."""
    if request.labels is not None:
        why = f"not named by {request.labels}"
    elif request.layout is DatasetLayout.FOLDER:
        why = "hidden or not images"
    else:
        why = "hidden or not WebDataset shards"
    shown = ", ".join(repr(name) for name in examples[:_SHOWN_SKIPPED])
    more = f" and {count - _SHOWN_SKIPPED} more" if count > _SHOWN_SKIPPED else ""
    hint = "" if request.labels is not None else " (--strict refuses them instead)"
    return f"skipped {count} objects, {why}: {shown}{more}{hint}"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dataset`` (with its ``index`` action) to the ``hapi`` parser."""
    dataset = subparsers.add_parser(
        "dataset",
        help="work with datasets already in Swift",
        description="Work with datasets that are already in Swift.",
    )
    actions = dataset.add_subparsers(dest="dataset_action", metavar="ACTION", required=True)
    index = actions.add_parser(
        "index",
        parents=[swift_options()],
        help="index data already in a container, in place (nothing is copied)",
        description="Build a manifest for images or WebDataset shards already in CONTAINER, "
        "writing only the manifest (and, for the folder layout, its part objects) into the "
        "--into container.",
        epilog=_EPILOG,
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    index.add_argument("--container", required=True, help="the container holding the data")
    index.add_argument(
        "--prefix", default="", help="index only objects under this folder (default: all)"
    )
    index.add_argument("--layout", required=True, choices=_LAYOUTS, help="how the data lies")
    index.add_argument(
        "--labels",
        metavar="OBJECT",
        help="folder layout: a labels object in CONTAINER (default: the class folder of each "
        "image)",
    )
    index.add_argument(
        "--label-field",
        metavar="FIELD",
        help="webdataset layout: the .json field holding the label (default: .cls or .txt)",
    )
    index.add_argument(
        "--into",
        metavar="MANIFEST_CONTAINER",
        help="container for the manifest and parts, which names the dataset (default: "
        "CONTAINER itself)",
    )
    index.add_argument(
        "--shard-size",
        type=int,
        default=DEFAULT_SHARD_SIZE,
        help="folder layout: images per part, the unit of a server request",
    )
    index.add_argument(
        "--strict",
        action="store_true",
        help="refuse, naming them, the objects that would be skipped (not images or not shards, "
        "or hidden) instead of skipping them",
    )
    index.add_argument(
        "--state-dir",
        type=Path,
        help="where an interrupted run keeps its progress (default: under ~/.cache/hapi/index)",
    )
    index.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress bars (default: when stderr is a terminal)",
    )
    index.set_defaults(func=_index)
