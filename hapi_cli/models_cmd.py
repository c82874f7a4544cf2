"""``hapi models [ARCH ...]``: the architectures HAPI can split, and what each split ships.

Without ``ARCH``: one line per listed architecture (the thesis' seven, every torchvision
classification network, every installed ``hapi.models`` plugin's) with its default freeze index
and what one sample's output there weighs. With names (``timm/NAME`` too): every split point of
each. Shapes come from :func:`hapi_models.describe_model` on the meta device; nothing is
computed, but a network not yet in the user's cache (``$HAPI_CACHE_DIR``, ``docs/models.md``) is
traced once, which for the whole listing takes about a minute on a 2-core CPU; once cached, the
listing takes seconds. A listed network that cannot be traced (or a plugin that fails to load) is
named on stderr and the listing goes on (exit status 1); an unknown ``ARCH`` is a usage error
(exit status 2) before anything is traced.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from .parsers import RawDescriptionDefaultsHelpFormatter
from .tables import format_table

if TYPE_CHECKING:
    from hapi_models import ModelListing

__all__ = ["DEFAULT_JPEG_KB", "register"]

#: The stored image the listing compares with: ImageNet's training JPEGs average about 110 KB
#: (1.28 million images in about 140 GB), as do the repository's ImageNet-sized photos.
DEFAULT_JPEG_KB = 110.0

#: Bytes per value of the two wire dtypes shown: float32, and bfloat16 (HAPI's default).
_FLOAT32, _BFLOAT16 = 4, 2


def _kb(nbytes: int) -> str:
    return f"{nbytes / 1e3:.1f}"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _summary(spec: ModelListing, jpeg_bytes: float) -> dict[str, Any]:
    points = spec.split_points()
    freeze = points[spec.default_freeze_index]
    bf16 = freeze.bytes_per_sample(_BFLOAT16)
    return {
        "name": spec.name,
        "family": spec.family,
        "split_points": len(points),
        "default_freeze_index": freeze.index,
        "freeze_layer": freeze.name,
        "input_shape": list(points[0].sample_shape),
        "freeze_shape": list(freeze.sample_shape),
        "freeze_bytes_float32": freeze.bytes_per_sample(_FLOAT32),
        "freeze_bytes_bfloat16": bf16,
        "jpeg_over_bfloat16": round(jpeg_bytes / bf16, 2),
    }


def _detail(spec: ModelListing) -> dict[str, Any]:
    return {
        "name": spec.name,
        "family": spec.family,
        "default_freeze_index": spec.default_freeze_index,
        "input_shape": list(spec.transform.input_shape),
        "split_points": [
            {
                "index": p.index,
                "layer": p.name,
                "shape": list(p.sample_shape),
                "bytes_float32": p.bytes_per_sample(_FLOAT32),
                "bytes_bfloat16": p.bytes_per_sample(_BFLOAT16),
                "default_freeze": p.index == spec.default_freeze_index,
            }
            for p in spec.split_points()
        ],
    }


def _summary_table(rows: list[dict[str, Any]], jpeg_bytes: float) -> str:
    table = format_table(
        [
            {
                "name": r["name"],
                "family": r["family"],
                "splits": r["split_points"],
                "freeze": f"{r['default_freeze_index']} ({r['freeze_layer']})",
                "input": _shape(tuple(r["input_shape"])),
                "f32 KB": _kb(r["freeze_bytes_float32"]),
                "bf16 KB": _kb(r["freeze_bytes_bfloat16"]),
                "JPEG/bf16": f"{r['jpeg_over_bfloat16']:.1f}x",
            }
            for r in rows
        ]
    )
    table = "\n".join(line.rstrip() for line in table.splitlines())
    return (
        f"{table}\n\nKB per sample at the default freeze index (the head runs every layer "
        f"before it); JPEG/bf16: a {jpeg_bytes / 1e3:.0f} KB stored JPEG over the bfloat16 "
        "features. `hapi models ARCH` lists every split point."
    )


def _detail_table(model: dict[str, Any]) -> str:
    header = (
        f"{model['name']} ({model['family']}): {len(model['split_points'])} split points, "
        f"input {_shape(tuple(model['input_shape']))}, default freeze index "
        f"{model['default_freeze_index']}"
    )
    table = format_table(
        [
            {
                "index": p["index"],
                "layer": p["layer"],
                "output": _shape(tuple(p["shape"])),
                "f32 KB": _kb(p["bytes_float32"]),
                "bf16 KB": _kb(p["bytes_bfloat16"]),
                "note": "default freeze" if p["default_freeze"] else "",
            }
            for p in model["split_points"]
        ]
    )
    return header + "\n" + "\n".join(line.rstrip() for line in table.splitlines())


def _models(args: argparse.Namespace) -> int:
    import hapi_models
    from tqdm import tqdm

    jpeg_bytes = args.jpeg_kb * 1e3
    if args.arch:
        # Every name first: a typo in the last one fails before the first is traced.
        for name in args.arch:
            hapi_models.get_spec(name)
        details = [_detail(hapi_models.describe_model(name)) for name in args.arch]
        if args.json:
            print(json.dumps({"models": details}, indent=2))
        else:
            print("\n\n".join(_detail_table(d) for d in details))
        return 0
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = hapi_models.broken_plugins()
    names = hapi_models.list_models()
    for name in tqdm(names, desc="listing", unit="model", file=sys.stderr, disable=None):
        # One network that cannot be traced (an operator's plugin) must not hide the others.
        try:
            rows.append(_summary(hapi_models.describe_model(name), jpeg_bytes))
        except hapi_models.HapiModelError as exc:
            failed[name] = str(exc)
    failed = dict(sorted(failed.items()))
    if args.json:
        print(json.dumps({"jpeg_bytes": jpeg_bytes, "models": rows, "failed": failed}, indent=2))
    else:
        print(_summary_table(rows, jpeg_bytes))
    for name, error in failed.items():
        print(f"hapi: error: {name}: {error}", file=sys.stderr)
    return 1 if failed else 0


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
    return number


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``models`` to the ``hapi`` parser."""
    p = subparsers.add_parser(
        "models",
        help="the architectures HAPI can split, with their split points",
        description="Without ARCH: every listed architecture (the thesis' seven, every torchvision "
        "classification network, every installed hapi.models plugin's) with its number of split "
        "points, default freeze index and the bytes one sample's features take there. With ARCH: "
        "each split point of each (index, layer, output shape, bytes per sample).",
        epilog="examples:\n  hapi models\n  hapi models vit_b_16 resnet50\n"
        "  hapi models timm/convnext_atto --json",
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    p.add_argument(
        "arch",
        nargs="*",
        metavar="ARCH",
        help="architectures to detail (any timm model as timm/NAME); none: list them all",
    )
    p.add_argument("--json", action="store_true", help="JSON on stdout, for machines")
    p.add_argument(
        "--jpeg-kb",
        type=_positive,
        default=DEFAULT_JPEG_KB,
        metavar="KB",
        help="the stored image the listing compares the features with, in KB (default: "
        "%(default)s, ImageNet's mean JPEG)",
    )
    p.set_defaults(func=_models)
