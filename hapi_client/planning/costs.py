"""Measuring what each split costs, for the split rule of :mod:`hapi_client.planning.time_rule`.

Three measurements, each made once per run:

* the dataset's images: the first few of the first shard, from a ranged read that also probes
  the bandwidth (a few hundred kilobytes when the bandwidth is already known);
* the server's costs: ``POST /v1/timings`` over those images' shard, on the server's device;
* the client's costs: the same images decoded here, the frozen layers timed one by one and the
  trainable tail's forward, backward and optimizer step, on the device that will train (kept per
  process: the same model on the same device costs the same next time).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hapi_models
import torch
from torch import nn
from torch.nn import functional

from hapi_contract import (
    Compression,
    DatasetLayout,
    OutputDtype,
    ShardSource,
    TimingsRequest,
    TransformSpec,
    images_in_prefix,
)

from ..errors import ConfigurationError, HapiClientError
from ..shard_loaders import read_source
from .time_rule import ClientCosts, ServerCosts

if TYPE_CHECKING:
    from ..preparation import PreparedModel
    from ..swift_session import SwiftSession
    from ..transport import HapiTransport

__all__ = ["PipelineCosts", "measure_client_costs", "measure_pipeline_costs"]

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")

#: Samples per timed batch: per-sample times at this batch are within a few percent of larger
#: ones on a CPU, and measuring stays a fraction of a second for the usual models.
TIMING_BATCH = 16
#: Images decoded to time the client's decode.
DECODE_SAMPLES = 8

_client_costs: dict[tuple[object, ...], ClientCosts] = {}


@dataclass(frozen=True)
class PipelineCosts:
    client: ClientCosts
    server: ServerCosts | None
    """None when the server could not be asked; ``server_missing`` says why."""
    server_missing: str = ""
    probed_bytes_per_s: float | None = None
    """The rate of the ranged read that fetched the images (a bandwidth probe)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_client_costs(
    net: hapi_models.SplittableModel,
    transform: hapi_models.InputTransform,
    freeze_index: int,
    images: list[bytes],
    device: torch.device,
    batch: int = TIMING_BATCH,
) -> ClientCosts:
    """Time the decode of ``images`` and the model's layers at ``batch`` samples on ``device``.

    The frozen layers run in eval mode under inference mode, as the local model runs them; the
    tail trains on a copy, so that ``net``'s weights and batch-norm statistics stay untouched.
    """
    if not images:
        raise ConfigurationError("no complete image to time the client's decode with")
    key = (net.arch, net.num_classes, transform, freeze_index, str(device), batch)
    known = _client_costs.get(key)
    start = time.perf_counter()
    decoded = transform.decode_batch(images)
    decode = (time.perf_counter() - start) / len(images)
    if known is not None:
        return ClientCosts(decode, known.layer_s, known.train_s, known.step_s, known.device)
    x = decoded.repeat((batch + len(images) - 1) // len(images), 1, 1, 1)[:batch].to(device)
    was_training = net.training
    net.eval()
    layers = list(net.layers)
    times: list[float] = []
    try:
        with torch.inference_mode():
            warm = x
            for layer in layers[:freeze_index]:
                warm = layer(warm)
            del warm
            for layer in layers[:freeze_index]:
                _sync(device)
                t0 = time.perf_counter()
                x = layer(x)
                _sync(device)
                times.append((time.perf_counter() - t0) / batch)
    finally:
        net.train(was_training)
    tail = copy.deepcopy(nn.Sequential(*layers[freeze_index:])).to(device).train()
    features = x.clone()  # a normal tensor: inference tensors cannot enter autograd
    labels = torch.zeros(batch, dtype=torch.int64, device=device)
    params = [p for p in tail.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9) if params else None
    train = step = 0.0
    for _ in range(2):  # the first round warms up; the second is kept
        _sync(device)
        t0 = time.perf_counter()
        out = tail(features)
        loss = functional.cross_entropy(out.flatten(1), labels)
        if params:
            loss.backward()
        _sync(device)
        t1 = time.perf_counter()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(device)
        train, step = (t1 - t0) / batch, time.perf_counter() - t1
    costs = ClientCosts(decode, times, train, step, str(device))
    _client_costs[key] = costs
    return costs


def _sample_images(
    swift: SwiftSession, source: ShardSource, stored_bytes_per_sample: float
) -> tuple[list[bytes], float]:
    """The first images of a shard and the rate they came at (a ranged read of a tar, which
    also feeds the bandwidth estimate). A ``folder`` part's images, or a tar whose prefix holds
    none the strict reader knows (gzip, ``.webp``), are read whole in their layout."""
    if source.layout is not DatasetLayout.FOLDER:
        if swift.bandwidth is None or swift.bandwidth.bytes_per_s is None:
            nbytes = 8 << 20  # the bandwidth probe's usual size: long enough to time
        else:
            nbytes = int((DECODE_SAMPLES + 1) * (stored_bytes_per_sample + 1536))
        rate, data = swift.read_prefix(source.container, source.shard, nbytes)
        images = images_in_prefix(data, DECODE_SAMPLES)
        if images:
            return images, rate
    began = time.perf_counter()
    samples, nbytes = read_source(swift, source)
    rate = nbytes / max(time.perf_counter() - began, 1e-9)
    return [s.image_bytes for s in samples[:DECODE_SAMPLES]], rate


def measure_pipeline_costs(
    swift: SwiftSession,
    transport: HapiTransport,
    prepared: PreparedModel,
    container: str,
    *,
    output_dtype: OutputDtype,
    compression: Compression,
    device: torch.device,
    b_max: int,
) -> PipelineCosts:
    """The client's and the server's costs of every split up to the freeze index: the images
    are read from ``swift``, the server's timings asked for through ``transport``."""
    manifest = prepared.manifest
    shard = manifest.shards[0]
    source = ShardSource.of(manifest, container, 0)
    images, rate = _sample_images(swift, source, manifest.mean_shard_bytes_per_sample)
    began = time.perf_counter()
    client_costs = measure_client_costs(
        prepared.net, prepared.transform, prepared.freeze_index, images, device
    )
    status.info(
        "timings: the client's cost of layers [0, %d) measured on %s in %.2f s",
        prepared.freeze_index,
        device,
        time.perf_counter() - began,
    )
    freeze = prepared.freeze_index
    if freeze == 0:
        return PipelineCosts(
            client_costs, None, "the freeze index is 0: nothing to push down", rate
        )
    req = TimingsRequest(
        container=source.container,
        shard=source.shard,
        layout=source.layout,
        data_container=source.data_container,
        label_field=source.label_field,
        model=prepared.stored.ref(),
        split_index=freeze,
        transform=TransformSpec.model_validate(prepared.transform),
        b_max=b_max,
        profile=prepared.profile_spec,
        output_dtype=output_dtype,
        compression=compression,
        samples=min(TIMING_BATCH, shard.samples, b_max),
    )
    began = time.perf_counter()
    try:
        got = transport.timings(req)
        status.info(
            "timings: the server's cost of layers [0, %d) measured in %.2f s",
            freeze,
            time.perf_counter() - began,
        )
    except HapiClientError as exc:
        log.warning("the server's timings are unavailable (%s): split by Algorithm 2", exc)
        return PipelineCosts(
            client_costs, None, f"the server's timings are unavailable: {exc}", rate
        )
    server = ServerCosts(
        got.decode_s_per_sample,
        got.layer_s_per_sample,
        got.encode_s_per_sample,
        got.wire_bytes_per_sample,
        got.load,
        got.device,
    )
    return PipelineCosts(client_costs, server, "", rate)
