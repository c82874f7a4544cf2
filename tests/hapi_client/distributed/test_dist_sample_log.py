"""The sample log: one file per start and rank, start/round/end lines, a cut line skipped."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from hapi_client.distributed import SampleLog, delivered, read_sample_log


def test_lines_of_a_start_and_what_was_delivered(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, attempt=7, rank=1, world=3, resumed_round=4)
    log.round(1, 5, torch.tensor([2, 2, 0]), torch.tensor([4, 1, 3]), wire_bytes=100)
    log.round(1, 6, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), 100)
    log.end(250)
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["attempt7-rank1.jsonl"]
    start, first, empty, end = read_sample_log(tmp_path)
    assert start["event"] == "start" and start["world"] == 3 and start["resumed_round"] == 4
    assert start["pid"] == os.getpid() and start["host"] == socket.gethostname()
    assert first["samples"] == [[2, 4], [2, 1], [0, 3]] and first["wire_bytes"] == 100
    assert empty["samples"] == [] and end == {**end, "event": "end", "wire_bytes": 250}
    assert delivered([start, first, empty, end]) == {1: [(2, 4), (2, 1), (0, 3)]}


def test_a_line_cut_short_by_a_kill_is_skipped(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, attempt=1, rank=0, world=1, resumed_round=0)
    log.round(0, 1, torch.tensor([0]), torch.tensor([0]), 0)
    log.close()
    path = tmp_path / "attempt1-rank0.jsonl"
    path.write_text(path.read_text() + '{"event": "round", "epo')
    assert [r["event"] for r in read_sample_log(tmp_path)] == ["start", "round"]


def test_no_records_deliver_nothing() -> None:
    # Issue 28, case 12: it raised "zip() argument 2 is longer than argument 1".
    assert delivered([]) == {}
