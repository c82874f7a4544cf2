"""``backbones``: the backbones people fine-tune today, split by HAPI's rules (issue 20).

For ViT-B/16, Swin-T, ConvNeXt-T, EfficientNetV2-S, RegNetY-400MF, MobileNetV3-S and ResNet50
(each randomly initialised: no weights are downloaded), on this machine's CPU, one thread per
side as the testbed gives the client and the server one core each:

* **bytes per sample at every split point** against the stored JPEG of the ImageNet-sized
  photos (:func:`hapi_bench.scenario_split.stored_bytes_per_sample`): the raw bfloat16 tensor and
  the frame the server would send (bfloat16, zstd: HAPI's default wire format), encoded by the
  server's own timing path (:func:`hapi_core.timing.measure_head`);
* **the split each rule picks** at 5, 50 and 1000 Mbit/s for a training batch of 50: ``auto``
  (:func:`hapi_client.planning.choose_split_by_time`, the default) on the costs a real run
  measures (the server's head layer by layer through ``measure_head``, the client's through
  :func:`hapi_client.planning.measure_client_costs`, both here), and ``thesis`` (Algorithm 2,
  :func:`hapi_client.planning.choose_split_index`);
* **the oracle comparison**, modelled: the epoch of :data:`EPOCH_SAMPLES` photos (the ``oracle``
  scenario's) at every split from the same measured costs as a three-stage pipeline (server,
  wire, client: the e2e scenario's lower bound max(storage CPU, client CPU, bytes / rate) per
  iteration) that also fills and drains, ``sum(stages) + (n - 1) * max(stages)``
  (:meth:`hapi_client.planning.StageTimes.epoch_s`); each rule's epoch over the best split's,
  and the same over :data:`LONG_EPOCH_SAMPLES` images, where the steady state rules. ``auto``
  ranks the splits by that same epoch time for the epoch it is told of (a run tells it its
  samples over its batch), so what these ratios show is what its 2 % tie band costs on the costs
  it sees, not how wrong the costs are: the ``oracle`` scenario measures real epochs of the
  thesis' networks;
* **the regime** of every row as the e2e scenario states it: BASELINE's crossover rate
  (:class:`hapi_bench.regime.Regime`, from the client's measured compute), network-bound below
  it, compute-bound above; and the stage that limits the chosen split.

No stack and no link: the rules' inputs are measured as a run measures them, and a ViT-B/16
forward takes a large share of a second per image on one core here, which would make real
epochs of every split minutes each. ``--quick`` times batches of 2 images, the full run 8.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import hapi_models
import torch

from hapi_client.datasets import get_source
from hapi_client.planning import (
    ClientCosts,
    ServerCosts,
    choose_split_by_time,
    choose_split_index,
    measure_client_costs,
)
from hapi_contract import Compression, OutputDtype, wire_itemsize
from hapi_contract.frames import FrameEncoder
from hapi_core.timing import HeadMeasurement, measure_head

from .regime import Regime
from .results import ResultSet
from .scenario_split import stored_bytes_per_sample

__all__ = ["MODELS", "RATES_MBIT", "run_backbones"]

MODELS = (
    "vit_b_16",
    "swin_t",
    "convnext_tiny",
    "efficientnet_v2_s",
    "regnet_y_400mf",
    "mobilenet_v3_small",
    "resnet50",
)
RATES_MBIT = (5.0, 50.0, 1000.0)
BATCH = 50
#: The epoch the oracle comparison models: the ``oracle`` scenario's 200 photos (4 iterations,
#: so filling and draining the pipeline weigh), and a longer one where the steady state rules.
EPOCH_SAMPLES = 200
LONG_EPOCH_SAMPLES = 10_000
#: Images per timed batch (quick, full) and photos per class behind the stored size.
TIMING_IMAGES = {True: 2, False: 8}
PER_CLASS = {True: 1, False: 10}
WIRE_DTYPE = OutputDtype.BFLOAT16
WIRE_COMPRESSION = Compression.ZSTD
#: Generous: the photos are 500x375.
MAX_PIXELS = 100_000_000


@contextmanager
def _one_thread() -> Iterator[None]:
    """Time on one core's worth of threads, as the testbed runs each side."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class _Measured:
    spec: hapi_models.ModelSpec
    profile: hapi_models.ModelProfile
    points: list[hapi_models.SplitPoint]
    head: HeadMeasurement
    server: ServerCosts
    client: ClientCosts
    seconds: float


def _measure(arch: str, images: list[bytes]) -> _Measured:
    started = time.perf_counter()
    spec = hapi_models.get_spec(arch)
    torch.manual_seed(0)
    net = hapi_models.get_model(arch)
    freeze = spec.default_freeze_index
    head = measure_head(
        net,
        freeze,
        images,
        spec.transform,
        torch.device("cpu"),
        FrameEncoder(dtype=WIRE_DTYPE, compression=WIRE_COMPRESSION),
        MAX_PIXELS,
        warm_up=True,
    )
    client = measure_client_costs(
        net, spec.transform, freeze, images, torch.device("cpu"), batch=len(images)
    )
    server = ServerCosts(
        head.decode_s_per_sample,
        head.layer_s_per_sample,
        head.encode_s_per_sample,
        head.wire_bytes_per_sample,
    )
    return _Measured(
        spec,
        hapi_models.profile(net),
        hapi_models.split_points(arch),
        head,
        server,
        client,
        time.perf_counter() - started,
    )


def _point_rows(m: _Measured, stored: float) -> Iterator[dict[str, Any]]:
    freeze = m.spec.default_freeze_index
    for p in m.points[: freeze + 1]:
        raw = p.bytes_per_sample(wire_itemsize(WIRE_DTYPE))
        wire = stored if p.index == 0 else m.head.wire_bytes_per_sample[p.index - 1]
        yield {
            "table": "points",
            "model": m.spec.name,
            "split_index": p.index,
            "layer": p.name,
            "shape": "x".join(map(str, p.sample_shape)),
            "bfloat16_bytes": raw,
            "wire_bytes": round(wire, 1),
            "stored_over_wire": round(stored / wire, 3),
            "server_head_s": round(
                m.head.decode_s_per_sample + sum(m.head.layer_s_per_sample[: p.index]), 5
            )
            if p.index
            else 0.0,
            "freeze_index": freeze,
        }


def _choice_rows(m: _Measured, stored: float, rates: tuple[float, ...]) -> Iterator[dict[str, Any]]:
    iterations = -(-EPOCH_SAMPLES // BATCH)
    long_iterations = -(-LONG_EPOCH_SAMPLES // BATCH)
    freeze = m.spec.default_freeze_index
    regime = Regime(
        m.spec.name,
        freeze,
        BATCH,
        stored,
        m.client.decode_s,
        sum(m.client.layer_s[:freeze]),
        m.client.train_s + m.client.step_s / BATCH,
    )
    for rate in rates:
        bandwidth = rate * 1e6 / 8
        auto = choose_split_by_time(
            m.server, m.client, stored, BATCH, bandwidth, freeze, iterations=iterations
        )
        thesis = choose_split_index(
            m.profile,
            stored,
            BATCH,
            bandwidth,
            freeze,
            wire_bytes_per_element=wire_itemsize(WIRE_DTYPE),
        )
        epochs = {t.split: t.epoch_s(iterations) for t in auto.predictions}
        stages = {t.split: t for t in auto.predictions}
        best = min(epochs, key=lambda s: (epochs[s], s))
        # The rule decides for the epoch it is told of: a run over 10,000 images asks it again.
        long_auto = choose_split_by_time(
            m.server, m.client, stored, BATCH, bandwidth, freeze, iterations=long_iterations
        )
        long = {t.split: t.epoch_s(long_iterations) for t in auto.predictions}
        long_best = min(long, key=lambda s: (long[s], s))
        chosen = stages[auto.split_index]
        yield {
            "table": "choices",
            "model": m.spec.name,
            "rate_mbit": rate,
            "freeze_index": freeze,
            "crossover_mbit": round(regime.crossover_mbit, 2),
            "regime": "network-bound" if rate < regime.crossover_mbit else "compute-bound",
            "auto_split": auto.split_index,
            "auto_limiter": chosen.limiter,
            "auto_mb_per_iteration": round(chosen.wire_bytes / 1e6, 3),
            "thesis_split": thesis.split_index,
            "best_split": best,
            "best_epoch_s": round(epochs[best], 3),
            "auto_epoch_s": round(epochs[auto.split_index], 3),
            "thesis_epoch_s": round(epochs[thesis.split_index], 3),
            "baseline_epoch_s": round(epochs[0], 3),
            "auto_over_best": round(epochs[auto.split_index] / epochs[best], 3),
            "thesis_over_best": round(epochs[thesis.split_index] / epochs[best], 3),
            "baseline_over_auto": round(epochs[0] / epochs[auto.split_index], 3),
            "long_best_split": long_best,
            "long_auto_split": long_auto.split_index,
            "long_auto_over_best": round(long[long_auto.split_index] / long[long_best], 3),
            "long_thesis_over_best": round(long[thesis.split_index] / long[long_best], 3),
            "auto_reason": auto.reason,
        }


def run_backbones(out_dir: str, quick: bool = True, models: tuple[str, ...] = MODELS) -> int:
    """The ``backbones`` scenario; writes ``backbones.json`` and ``backbones.csv``."""
    n = TIMING_IMAGES[quick]
    stored, spec = stored_bytes_per_sample(PER_CLASS[quick])
    images = [s.image for s in islice(get_source(spec), n)]
    results = ResultSet.start(
        "backbones",
        quick=quick,
        dataset={"source": spec, "stored_bytes_per_sample": stored},
        rates_mbit=list(RATES_MBIT),
        batch_size=BATCH,
        epoch_samples=EPOCH_SAMPLES,
        long_epoch_samples=LONG_EPOCH_SAMPLES,
        timing_images=n,
        wire={"dtype": str(WIRE_DTYPE), "compression": str(WIRE_COMPRESSION)},
        torch_threads=1,
        testbed={"link": "none (costs measured here, epochs modelled)"},
    )
    out = Path(out_dir)
    for arch in models:
        with _one_thread():
            measured = _measure(arch, images)
        for row in _point_rows(measured, stored):
            results.add(row)
        choices = list(_choice_rows(measured, stored, RATES_MBIT))
        for row in choices:
            results.add(row)
        results.write(out)
        print(
            f"[backbones] {arch:18s} measured in {measured.seconds:5.1f} s; "
            + "  ".join(
                f"{r['rate_mbit']:g} Mbit/s: auto {r['auto_split']} thesis {r['thesis_split']} "
                f"best {r['best_split']} ({r['auto_over_best']:.2f}x, {r['regime']})"
                for r in choices
            ),
            flush=True,
        )
    paths = results.write(out)
    print("[backbones] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
