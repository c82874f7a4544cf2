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
        f"split {meta.get('split')} (the demo's head, both paths) and the other heads listed "
        "(the new path), one `/v1/extract` of one shard at COS batch <= "
        f"{meta.get('batch')} ({testbed.get('cores_note', 'cores as the testbed set them')}; "
        f"{len(cores)} server core(s)). *new*: the fast decode, the batch norms folded, the "
        "layout and samples per forward chosen per head, glibc's maps on huge pages; *old*: "
        "`HAPI_DECODE_PATH=pil HAPI_DECODE_THREADS=0 HAPI_CHANNELS_LAST=false "
        "HAPI_FOLD_BATCH_NORMS=false GLIBC_TUNABLES=glibc.malloc.hugetlb=0`. Each path on a "
        f"fresh stack, the two taking turns over {meta.get('rounds')} round(s), the best request "
        "per path (the server's own clock); the ceilings are the server's cores over one image's "
        "CPU seconds in each stage, timed on one thread of a server core in a process set up as "
        "that path's server (its allocator bounds and glibc tunables; the best of the rounds), "
        "the roofline the cores over the seconds of decode + head + the Swift read (Swift runs on "
        "the server's cores)." + load_when_begun(meta)
    )


def _row(row: dict[str, Any], meta: dict[str, Any]) -> list[Any]:
    return [
        f"{row.get('arch', meta.get('arch'))}:{row.get('split', meta.get('split'))}",
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
        "head",
        "path",
        "images/s on the server",
        "decode ceiling",
        "head ceiling",
        "Swift read",
        "roofline images/s",
        "end to end / roofline",
    ]
    speedup, ratio = meta.get("new_over_old"), meta.get("roofline_ratio")
    lines = [
        TITLE,
        "",
        _setup(results),
        "",
        markdown_table(header, [_row(row, meta) for row in results.rows]),
        "",
    ]
    if speedup is not None and ratio is not None:
        lines += [
            f"New / old: **{speedup:.2f}x** the images per second on the server (goal >= "
            f"{goals.get('new_over_old', 2.0)}x); end to end / roofline **{ratio:.2f}** at worst "
            f"(goal >= {goals.get('roofline_ratio', 0.9)} for each head). The features' relative "
            "difference, new decode "
            f"against old: {meta.get('feature_relative_difference', float('nan')):.2g} on the "
            "scenario's photos, "
            f"{meta.get('feature_relative_difference_large', float('nan')):.2g} on 2000x1500 "
            "ones (reduced-DCT decode).",
            "",
        ]
    return lines
