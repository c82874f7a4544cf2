"""run_batch: an image that does not decode is named by the job's names (both executions); a job
that runs out of host memory says so by type (507), wherever the allocation failed, and its
failed batch's tensors are freed with the job even while its error is kept."""

from __future__ import annotations

import threading
import weakref
from types import SimpleNamespace
from typing import Any, cast

import hapi_models
import pytest
import torch

from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import FrameEncoder
from hapi_core.devices import Device
from hapi_core.engine import (
    BatchExecutionError,
    ExtractionJob,
    JobStats,
    iter_frames,
    run_batch,
    run_extraction,
)
from hapi_core.forward_turns import ForwardTurns
from tests.hapi_core.images import random_jpeg

SMALL = hapi_models.InputTransform(resize=32, crop=32)


def test_a_truncated_image_in_a_later_batch_is_named_by_its_own_entry() -> None:
    cut = random_jpeg(3)
    images = [random_jpeg(0), random_jpeg(1), random_jpeg(2), cut[: len(cut) // 2]]
    names = [f"data/img/{i:04d}.jpg" for i in range(len(images))]
    stats = JobStats()

    def batch(start: int) -> bytes:
        return run_batch(
            torch.nn.Identity(),
            SMALL,
            images,
            [0] * len(images),
            start,
            2,
            torch.device("cpu"),
            FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
            10_000,
            stats,
            names,
        )

    assert batch(0)
    with pytest.raises(hapi_models.ImageDecodeError, match=r"^data/img/0003\.jpg: cannot decode"):
        batch(2)


def test_a_failed_allocation_of_the_decode_buffer_is_a_batch_execution_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With glibc's mmap threshold fixed (hapi_core.host_allocator), the next batch's uint8
    # buffer is a fresh mapping, and under a memory limit it can be the allocation that fails.
    empty = torch.empty

    def refuse_uint8(*args: object, **kwargs: object) -> torch.Tensor:
        if kwargs.get("dtype") is torch.uint8:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(torch, "empty", refuse_uint8)
    job = _two_image_job(hapi_models.get_spec("alexnet").builder(3, False))
    with pytest.raises(BatchExecutionError, match="can't allocate memory"):
        list(iter_frames(job, JobStats()))


def _two_image_job(model: Any) -> ExtractionJob:
    """One CPU batch of two small JPEGs through ``model``'s head at split 1, float32 frames."""
    return ExtractionJob(
        model=model,
        split=1,
        images=[random_jpeg(0), random_jpeg(1)],
        labels=[0, 0],
        transform=SMALL,
        batch_size=2,
        device=Device("cpu", 2**30),
        max_pixels=10_000,
        encoder=FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
    )


class _RunsOut(torch.nn.Module):
    """A head whose second allocation fails, as resnet18's bn1 under a memory limit."""

    def __init__(self, seen: list[weakref.ref[torch.Tensor]]) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activation = torch.relu(x)  # conv1's output: a batch-sized local of this frame
        self.seen += [weakref.ref(x), weakref.ref(activation)]
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")


@pytest.fixture
def failing_job(monkeypatch: pytest.MonkeyPatch) -> tuple[ExtractionJob, list[weakref.ref[Any]]]:
    """A job whose batch fails in its head; ``seen`` gets a weakref to each batch tensor: the
    decoded uint8 batch, the float input, the activation."""
    seen: list[weakref.ref[Any]] = []
    normalize = hapi_models.InputTransform.normalize

    def noted(self: hapi_models.InputTransform, batch: torch.Tensor) -> torch.Tensor:
        seen.append(weakref.ref(batch))
        return normalize(self, batch)

    monkeypatch.setattr(hapi_models.InputTransform, "normalize", noted)
    model = SimpleNamespace(arch="runs-out", head=lambda split: _RunsOut(seen))
    job = _two_image_job(cast(Any, model))
    return job, seen


def test_a_failed_job_frees_its_batch_while_its_error_is_kept(
    failing_job: tuple[ExtractionJob, list[weakref.ref[Any]]], no_collector: None
) -> None:
    job, seen = failing_job
    # pytest keeps the error, as a host that hands it on as a value does.
    with pytest.raises(BatchExecutionError, match="can't allocate memory") as failed:
        run_extraction(job, lambda frame: None, threading.Event())
    assert len(seen) == 3
    assert [ref() is None for ref in seen] == [True, True, True]
    assert "can't allocate memory" in str(failed.value.__cause__)  # the cause is still told


def test_a_failed_step_frees_the_tensors_of_the_frames_it_left(
    failing_job: tuple[ExtractionJob, list[weakref.ref[Any]]], no_collector: None
) -> None:
    """A host stepping the job itself (the Swift filter): the head's input and activations go;
    the decoded batch goes with the generator's frame, which that host's pool clears."""
    job, seen = failing_job
    with pytest.raises(BatchExecutionError) as failed:
        next(iter_frames(job, JobStats()))
    _, x, activation = seen
    assert x() is None and activation() is None
    assert failed.value.__traceback__ is not None  # kept until here


class _Gated(torch.nn.Module):
    """A head that says when its forward began and, for the first job, holds it until told."""

    def __init__(self, entered: threading.Event, hold: threading.Event | None) -> None:
        super().__init__()
        self.entered, self.hold = entered, hold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(30)
        return x.mean(dim=(2, 3))


def test_jobs_sharing_a_cpus_turns_run_their_forward_passes_one_after_the_other() -> None:
    turns = ForwardTurns(1)
    entered_a, entered_b, hold = threading.Event(), threading.Event(), threading.Event()
    jobs = []
    for name, entered, held in (("a", entered_a, hold), ("b", entered_b, None)):
        head = _Gated(entered, held)
        job = _two_image_job(cast(Any, SimpleNamespace(arch=name, head=lambda split, h=head: h)))
        job.turns, job.owner, job.arrived = turns, "account", float(len(jobs))
        jobs.append(job)
    frames: dict[str, list[bytes]] = {"a": [], "b": []}
    stats: dict[str, JobStats] = {}

    def run(job: ExtractionJob, name: str) -> None:
        stats[name] = run_extraction(job, frames[name].append, threading.Event())

    first = threading.Thread(target=run, args=(jobs[0], "a"))
    first.start()
    assert entered_a.wait(30)
    second = threading.Thread(target=run, args=(jobs[1], "b"))
    second.start()
    deadline = threading.Event()
    for _ in range(30_000):  # bounded: until b waits for the turn a holds
        if turns.waiting == 1:
            break
        deadline.wait(0.001)
    assert turns.waiting == 1 and not entered_b.is_set()
    hold.set()
    first.join(30)
    second.join(30)
    assert entered_b.is_set() and len(frames["a"]) == len(frames["b"]) == 1
    assert stats["b"].turns_s > 0 and stats["b"].compute_s < stats["b"].turns_s
    assert "turns" in stats["b"].as_meta(1.0, 0.0)["server_ms"]  # type: ignore[operator]
