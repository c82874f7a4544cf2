"""Plain-text tables for the commands' per-epoch output."""

from __future__ import annotations

__all__ = ["format_table"]


def format_table(rows: list[dict[str, object]]) -> str:
    """Left-aligned columns named by the first row's keys, with a dashed rule under the header."""
    if not rows:
        return ""
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols), "  ".join("-" * width[c] for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(lines)
