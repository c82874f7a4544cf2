"""The ``jobsplit`` scenario's section of ``hapi bench report`` (issue 31): each split rule's
whole job (the decision and every epoch) over the best measured split's, on data indexed in
place and on shards."""

from __future__ import annotations

from typing import Any

from .report import load_when_begun, markdown_table
from .results import ResultSet
from .scenario_job_split import job_split_summary

__all__ = ["GOAL", "job_split_section"]

#: Issue 31's bound: auto's job within this factor of the best split's, and of freeze's and
#: BASELINE's (never more than 10 % slower than either).
GOAL = 1.10
TITLE = "## The split decision on the whole job, data indexed in place (jobsplit, issue 31)"


def _setup(results: ResultSet) -> str:
    meta = results.meta
    testbed = meta.get("testbed", {})
    datasets = "; ".join(
        f"`{label}`: {d.get('num_samples')} samples, {d.get('layout')} layout, about "
        f"{float(d.get('stored_bytes_per_sample') or 0) / 1e3:.0f} KB per sample"
        for label, d in meta.get("datasets", {}).items()
    )
    links = ", ".join(
        f"{c.get('target_mbit'):g} Mbit/s (measured {float(c.get('measured_mbit') or 0):.0f})"
        for c in meta.get("link_checks", [])
        if c.get("target_mbit") is not None
    )
    return (
        f"`hapi bench jobsplit{' --quick' if meta.get('quick') else ''}` "
        f"({testbed.get('cores_note', 'cores as the testbed set them')}; link by "
        f"{testbed.get('link_method', 'the testbed')}: {links or 'unshaped'}). {datasets}. "
        f"A {meta.get('epochs')}-epoch job with the feature cache at batch "
        f'{meta.get("batch_size")}; in each cell the job runs with `split="auto"`, the freeze '
        "index, BASELINE (split 0) and the splits whose predicted job is nearest auto's, each "
        f"{meta.get('repeats', 1)} time(s) round after round"
        + (
            " after a warm-up round of auto and the extra splits that is not judged (the freeze "
            "index's head was run by the server's warm-up extraction; BASELINE has none)"
            if meta.get("warmup_round")
            else ""
        )
        + (
            f"; a run over {meta['prune_over_best']:g}x the cell's best after the first judged "
            "round is not repeated"
            if meta.get("prune_over_best")
            else ""
        )
        + ", and each split is judged by the least of its rounds. *Job*: the decision (0 for a "
        "forced split) plus every epoch. "
        "*Decision aside*: auto's job less its decision, over the best. "
        "*Noise*: the largest ratio in the cell of one split's longest job over its shortest; "
        "a ratio below it is not a measured difference." + load_when_begun(meta)
    )


def _row(cell: dict[str, Any]) -> list[Any]:
    auto = cell.get("auto_splits") or [cell.get("auto_split")]
    freeze = cell.get("freeze_job_s")
    over_freeze = None if not freeze else cell["auto_job_s"] / freeze
    decided = cell.get("auto_decided_s")
    return [
        cell["dataset"],
        cell["model"],
        f"{cell['rate_mbit']:g}",
        cell["best_split"],
        f"{cell['best_job_s']:.2f}",
        ", ".join(str(s) for s in auto),
        cell.get("auto_over_best"),
        cell.get("auto_aside_over_best"),
        cell.get("freeze_over_best"),
        cell.get("baseline_over_best"),
        None if over_freeze is None else f"{over_freeze:.2f}",
        None
        if decided is None
        else f"{decided:.2f} (longest {cell.get('auto_decided_max_s', decided):.2f})",
        cell.get("noise"),
    ]


def _verdict(summary: list[dict[str, Any]]) -> str:
    judged = [c for c in summary if c.get("auto_over_best") is not None]
    if not judged:
        return "No cell has an `auto` run."
    within = [c for c in judged if c["auto_over_best"] <= GOAL]
    worst = max(judged, key=lambda c: c["auto_over_best"])
    noisy = [c for c in judged if c.get("noise", 1.0) > GOAL]
    text = (
        f"`auto` within {GOAL:.2f}x of the best measured job in **{len(within)} of "
        f"{len(judged)}** cells; the worst {worst['auto_over_best']:.2f}x ({worst['model']}, "
        f"{worst['rate_mbit']:g} Mbit/s, {worst['dataset']}: split {worst.get('auto_split')} "
        f"against {worst['best_split']})."
    )
    for rule, name in (("freeze", "the freeze index"), ("baseline", "BASELINE")):
        against = [c for c in judged if c.get(f"{rule}_job_s")]
        slower = [c for c in against if c["auto_job_s"] > GOAL * c[f"{rule}_job_s"]]
        if against:
            text += (
                f" More than {GOAL - 1:.0%} slower than {name} in {len(slower)} of "
                f"{len(against)}"
                + (
                    ": "
                    + ", ".join(
                        f"{c['model']} {c['rate_mbit']:g} Mbit/s {c['dataset']}" for c in slower
                    )
                    if slower
                    else ""
                )
                + "."
            )
    if noisy:
        text += (
            f" In {len(noisy)} cell(s) the runs' own noise is above {GOAL:.2f}: there a ratio "
            "up to the noise is not a measured difference."
        )
    return text


def job_split_section(results: ResultSet) -> list[str]:
    summary = job_split_summary(results.rows)
    header = [
        "dataset",
        "model",
        "Mbit/s",
        "best split",
        "best job s",
        "auto split",
        "auto / best",
        "decision aside",
        "freeze / best",
        "BASELINE / best",
        "auto / freeze",
        "auto decided s",
        "noise",
    ]
    return [
        TITLE,
        "",
        _setup(results),
        "",
        markdown_table(header, [_row(cell) for cell in summary]),
        "",
        _verdict(summary),
        "",
    ]
