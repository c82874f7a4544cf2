"""PNG plots of the scenarios' results (matplotlib, headless)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # noqa: E402

from .results import ResultSet  # noqa: E402

__all__ = ["plot_adaptation", "plot_e2e", "plot_gars", "plot_proxy", "plot_split", "plot_tenants"]

_MODE_STYLE = {
    "baseline": ("BASELINE", "tab:red"),
    "hapi": ("HAPI", "tab:blue"),
    "all_in_cos": ("ALL_IN_COS", "tab:green"),
}


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _footer(fig: Any, results: ResultSet) -> None:
    machine = results.meta.get("machine", {})
    testbed = results.meta.get("testbed", {})
    text = f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; link: {testbed.get('link', '-')}"
    fig.text(0.01, 0.005, text, fontsize=7, color="grey")


def plot_e2e(results: ResultSet, out_dir: Path) -> list[Path]:
    """``e2e.png``: AlexNet epoch time and bytes/iteration vs rate; every model at 100 Mbit/s."""
    rows = results.rows
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    sweep = [r for r in rows if r["model"] == "alexnet"]
    for mode, (label, colour) in _MODE_STYLE.items():
        points = sorted((r["rate_target_mbit"], r) for r in sweep if r["mode"] == mode)
        if not points:
            continue
        xs = [p[0] for p in points]
        axes[0].plot(xs, [p[1]["epoch_s"] for p in points], "o-", color=colour, label=label)
        if mode == "hapi":
            axes[0].plot(
                xs,
                [p[1]["lower_bound_s"] for p in points],
                ":",
                color=colour,
                label="HAPI lower bound",
            )
        axes[1].plot(
            xs,
            [max(p[1]["bytes_per_iteration"], 1) / 1e6 for p in points],
            "o-",
            color=colour,
            label=label,
        )
    crossover = results.meta.get("regimes", {}).get("alexnet", {}).get("crossover_mbit")
    if crossover:
        for ax in axes[:2]:
            ax.axvline(
                crossover,
                color="grey",
                linestyle="--",
                label=f"BASELINE link = compute ({crossover:.0f} Mbit/s)",
            )
        axes[0].annotate(
            "network-bound \u2190",
            (crossover, 0.95),
            xycoords=("data", "axes fraction"),
            ha="right",
            fontsize=8,
        )
    for ax, ylabel, title in (
        (axes[0], "epoch time (s)", "AlexNet: epoch time (cf. Fig 5.9)"),
        (axes[1], "MB per iteration", "AlexNet: data per iteration (cf. Fig 5.10)"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Mbit/s)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    at100 = [r for r in rows if r["rate_target_mbit"] == 100.0]
    models = list(dict.fromkeys(r["model"] for r in at100))
    width = 0.8 / len(_MODE_STYLE)
    for i, (mode, (label, colour)) in enumerate(_MODE_STYLE.items()):
        values = []
        for model in models:
            match = [r["epoch_s"] for r in at100 if r["model"] == model and r["mode"] == mode]
            values.append(match[0] if match else 0.0)
        axes[2].bar(
            [x + i * width for x in range(len(models))], values, width, color=colour, label=label
        )
    axes[2].set_xticks([x + width for x in range(len(models))], models)
    axes[2].set_ylabel("epoch time (s)")
    axes[2].set_title("every model at 100 Mbit/s")
    axes[2].legend(fontsize=8)
    _footer(fig, results)
    return [_save(fig, out_dir / "e2e.png")]


def plot_split(results: ResultSet, out_dir: Path) -> list[Path]:
    """``split.png``: chosen split vs bandwidth (Table 5.3) and vs training batch (Fig 5.12)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    by_model: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results.rows:
        by_model[(r["sweep"], r["model"])].append(r)
    for (sweep, model), rows in by_model.items():
        if sweep == "bandwidth":
            rows.sort(key=lambda r: r["bandwidth_gbit"])
            axes[0].plot(
                [r["bandwidth_gbit"] for r in rows],
                [r["split_index"] for r in rows],
                "o-",
                label=f"{model} (freeze {rows[0]['freeze_index']})",
            )
        else:
            rows.sort(key=lambda r: r["batch_size"])
            axes[1].plot(
                [r["batch_size"] for r in rows], [r["split_index"] for r in rows], "o-", label=model
            )
    thesis = results.meta.get("thesis_table_5_3", {})
    if thesis:
        axes[0].plot(
            thesis["bandwidth_gbit"],
            thesis["split_index"],
            "k--",
            alpha=0.6,
            label="thesis Table 5.3 (AlexNet)",
        )
    axes[0].set_xscale("log")
    axes[0].set_xlabel("bandwidth (Gbit/s)")
    axes[0].set_title(f"split vs bandwidth (batch {results.meta.get('batch_for_bandwidth')})")
    axes[1].set_xlabel("training batch")
    axes[1].set_title(f"split vs batch ({results.meta.get('bandwidth_for_batch_gbit')} Gbit/s)")
    for ax in axes:
        ax.set_ylabel("split index")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _footer(fig, results)
    return [_save(fig, out_dir / "split.png")]


def plot_tenants(results: ResultSet, out_dir: Path) -> list[Path]:
    """``tenants.png``: makespan and average JCT vs tenants, HAPI vs ALL_IN_COS (Fig 5.11)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for mode, (label, colour) in _MODE_STYLE.items():
        rows = sorted((r for r in results.rows if r["mode"] == mode), key=lambda r: r["tenants"])
        if not rows:
            continue
        xs = [r["tenants"] for r in rows]
        ax.plot(xs, [r["makespan_s"] for r in rows], "o-", color=colour, label=f"{label} makespan")
        ax.plot(xs, [r["avg_jct_s"] for r in rows], "s--", color=colour, label=f"{label} avg JCT")
    ax.set_xlabel("simultaneous jobs")
    ax.set_ylabel("seconds")
    ax.set_title("multi-tenancy (cf. Fig 5.11)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _footer(fig, results)
    return [_save(fig, out_dir / "tenants.png")]


def plot_adaptation(results: ResultSet, out_dir: Path) -> list[Path]:
    """``adaptation.png``: completed/failed requests and peak memory, BA on vs off (Fig 5.13)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    budget = results.meta.get("budget_bytes")
    for adaptive, colour in ((True, "tab:blue"), (False, "tab:red")):
        rows = sorted(
            (r for r in results.rows if r["adaptation"] is adaptive), key=lambda r: r["requests"]
        )
        if not rows:
            continue
        label = "BA on" if adaptive else "BA off"
        xs = [r["requests"] for r in rows]
        axes[0].plot(
            xs, [r["completed"] for r in rows], "o-", color=colour, label=f"{label}: completed"
        )
        axes[0].plot(
            xs, [r["oom_failures"] for r in rows], "x--", color=colour, label=f"{label}: OOM"
        )
        axes[1].plot(
            xs, [r["peak_memory_bytes"] / 2**20 for r in rows], "o-", color=colour, label=label
        )
    if budget:
        axes[1].axhline(budget / 2**20, color="k", ls=":", label="memory budget")
    axes[0].set_ylabel("requests")
    axes[1].set_ylabel("peak request memory (MiB)")
    for ax in axes:
        ax.set_xlabel("parallel requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("outcomes (cf. Table 5.4)")
    axes[1].set_title("memory (cf. Fig 5.13)")
    _footer(fig, results)
    return [_save(fig, out_dir / "adaptation.png")]


def plot_proxy(results: ResultSet, out_dir: Path) -> list[Path]:
    """``proxy.png``: epoch time per model, decoupled server vs in-proxy execution (Table 5.1)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    models = list(dict.fromkeys(r["model"] for r in results.rows))
    for i, (execution, colour) in enumerate(
        (("decoupled", "tab:blue"), ("in_proxy", "tab:orange"))
    ):
        values = []
        for model in models:
            match = [
                r["epoch_s"]
                for r in results.rows
                if r["model"] == model and r["execution"] == execution
            ]
            values.append(match[0] if match else 0.0)
        ax.bar(
            [x + i * 0.4 for x in range(len(models))], values, 0.4, color=colour, label=execution
        )
    ax.set_xticks([x + 0.2 for x in range(len(models))], models)
    ax.set_ylabel("epoch time (s)")
    ax.set_title("in-proxy vs decoupled server (cf. Table 5.1)")
    ax.legend(fontsize=8)
    _footer(fig, results)
    return [_save(fig, out_dir / "proxy.png")]


def plot_gars(results: ResultSet, out_dir: Path) -> list[Path]:
    """``gars.png``: median aggregation time per rule for each (n, d)."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    rules = list(dict.fromkeys(str(r["rule"]) for r in results.rows))
    cells = sorted({(int(r["d"]), int(r["n"])) for r in results.rows})
    width = 0.8 / max(1, len(cells))
    for i, (d, n) in enumerate(cells):
        values = []
        for rule in rules:
            match = [
                r["median_ms"]
                for r in results.rows
                if r["rule"] == rule and r["d"] == d and r["n"] == n
            ]
            values.append(match[0] if match else 0.0)
        ax.bar([x + i * width for x in range(len(rules))], values, width, label=f"n={n}, d={d:.0e}")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rules))], rules, rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("median ms")
    ax.set_title("aggregation rules (cf. Garfield's micro-benchmark)")
    ax.legend(fontsize=7)
    _footer(fig, results)
    return [_save(fig, out_dir / "gars.png")]
