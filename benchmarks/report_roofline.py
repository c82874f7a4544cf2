"""The ``roofline`` scenario's section of ``hapi bench report`` (issue 30): the server's images
per second on its new path and its old one, against the ceilings of its cores."""

from __future__ import annotations

from typing import Any

from .report import load_when_begun, markdown_table
from .results import ResultSet

__all__ = ["roofline_section"]

TITLE = "## The server at its roofline (issue 30)"


def _setup(results: ResultSet) -> str:
    meta = results.meta
    testbed = meta.get("testbed", {})
    cores = meta.get("server_cores", [])
    return (
        f"`hapi bench roofline{' --quick' if meta.get('quick') else ''}`: {meta.get('arch')} to "
        f"split {meta.get('split')}, one `/v1/extract` of one shard at COS batch <= "
        f"{meta.get('batch')} ({testbed.get('cores_note', 'cores as the testbed set them')}; "
        f"{len(cores)} server core(s)). *new*: the fast decode and the layout chosen per head; "
        "*old*: `HAPI_DECODE_PATH=pil HAPI_DECODE_THREADS=0 HAPI_CHANNELS_LAST=false`. Each path "
        f"on a fresh stack, the two taking turns over {meta.get('rounds')} round(s), the best "
        "request per path (the server's own clock); the ceilings are the server's cores over one "
        "image's CPU seconds in each stage (the best of the rounds), the roofline the cores over "
        "decode + head, bounded by the Swift read." + load_when_begun(meta)
    )


def _row(row: dict[str, Any]) -> list[Any]:
    return [
        row["path"],
        f"{row['server_images_per_s']:.1f}",
        f"{row['decode_ceiling_images_per_s']:.0f}",
        f"{row['head_ceiling_images_per_s']:.1f}",
        f"{row['read_images_per_s']:.0f}",
        f"{row['roofline_images_per_s']:.1f}",
        f"{row['roofline_ratio']:.2f}",
    ]


def roofline_section(results: ResultSet) -> list[str]:
    meta = results.meta
    goals = meta.get("goals", {})
    header = [
        "path",
        "images/s on the server",
        "decode ceiling",
        "head ceiling",
        "Swift read",
        "roofline images/s",
        "end to end / roofline",
    ]
    speedup, ratio = meta.get("new_over_old"), meta.get("roofline_ratio")
    lines = [TITLE, "", _setup(results), "", markdown_table(header, map(_row, results.rows)), ""]
    if speedup is not None and ratio is not None:
        lines += [
            f"New / old: **{speedup:.2f}x** the images per second on the server (goal >= "
            f"{goals.get('new_over_old', 2.0)}x); end to end / roofline **{ratio:.2f}** (goal >= "
            f"{goals.get('roofline_ratio', 0.9)}). The features' relative difference, new decode "
            f"against old: {meta.get('feature_relative_difference', float('nan')):.2g} on the "
            "scenario's photos, "
            f"{meta.get('feature_relative_difference_large', float('nan')):.2g} on 2000x1500 "
            "ones (reduced-DCT decode).",
            "",
        ]
    return lines
