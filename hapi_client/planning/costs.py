"""Measuring what each split costs, for the split rule of :mod:`hapi_client.planning.time_rule`.

Three measurements, each made once per run:

* the dataset's images: the first few of the first shard, from a ranged read that also probes
  the bandwidth (a few hundred kilobytes when the bandwidth is already known); a ``folder``
  part's images read at the epoch's concurrency, the link probed apart on the model's weights;
* the server's costs: ``POST /v1/timings`` over those images' shard, on the server's device,
  asked once they are read, while the client times its own layers;
* the client's costs: the same images decoded here, the frozen layers timed one by one and the
  trainable tail's forward, backward and optimizer step, on the device that will train (kept per
  process and on local disk, :mod:`.cost_cache`: the same model on the same machine costs the
  same next time, in this process or the next).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hapi_models
import torch
from torch import nn
from torch.nn import functional

from hapi_contract import (
    Compression,
    DatasetLayout,
    ImageData,
    OutputDtype,
    ShardSource,
    TimingsRequest,
    TimingsResponse,
    TransformSpec,
    images_in_prefix,
)
from hapi_contract.layouts import parse_part
from hapi_contract.shard_reading import check_pin

from ..errors import ConfigurationError, HapiClientError
from ..frozen_layers import FOLDER, LAYOUTS
from ..shard_loaders import OBJECT_READ_CONCURRENCY, read_source
from .cost_cache import KeptCosts, cost_key, read_costs, write_costs
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
#: Of those, what a ``folder`` part's reads fetch however slow the link: eight ImageNet-size
#: JPEGs are 0.9 MB, 1.4 s of a 5 Mbit/s link, most of a plan; a decode timed over two is
#: within the noise of one timed over eight.
MIN_DECODE_SAMPLES = 2
#: A ``folder`` part's images read to time per-image reads: the read concurrency three times.
OBJECT_SAMPLES = 48
#: The link probe's size when the bandwidth is not known yet: long enough to time.
PROBE_BYTES = 8 << 20
#: Seconds the plan's link probe may read for: half a second times a link's rate as well as
#: megabytes do (the slowest links get a few hundred kilobytes), and a warm plan stays within
#: its 2 s (8 MB at 50 Mbit/s would be 1.3 s of it).
PROBE_S = 0.5
#: Seconds the per-image reads may take before no further one starts: enough rounds of
#: ``OBJECT_READ_CONCURRENCY`` reads to time them, never megabytes at a slow link's rate.
OBJECT_READS_S = 0.5

_client_costs: dict[tuple[object, ...], ClientCosts] = {}


@dataclass(frozen=True)
class PipelineCosts:
    client: ClientCosts
    server: ServerCosts | None
    """None when the server could not be asked; ``server_missing`` says why."""
    server_missing: str = ""
    probed_bytes_per_s: float | None = None
    """The link's rate from the plan's ranged read (a bandwidth probe): the shard's prefix, or
    for a ``folder`` dataset the model's weights; None when the bandwidth was already known."""
    objects_per_s: float | None = None
    """A ``folder`` dataset's image reads per second at the read concurrency of an epoch
    (``OBJECT_READ_CONCURRENCY``); None for shards, whose one object per shard costs one
    request per hundreds of samples."""


@dataclass(frozen=True)
class _Sampled:
    images: Sequence[ImageData]
    link_bytes_per_s: float | None
    objects_per_s: float | None


def measure_client_costs(
    net: hapi_models.SplittableModel,
    transform: hapi_models.InputTransform,
    freeze_index: int,
    images: Sequence[ImageData],
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
    disk_key = cost_key(net, transform, freeze_index, device, batch)
    kept = read_costs(disk_key)
    if kept is not None and len(kept.layer_s) == freeze_index:
        status.info(
            "timings: the client's cost of layers [0, %d) of %s on %s as measured by an earlier "
            "run on this machine",
            freeze_index,
            net.arch,
            device,
        )
        costs = ClientCosts(decode, kept.layer_s, kept.train_s, kept.step_s, str(device))
        _client_costs[key] = costs
        return costs
    status.info(
        "timings: timing the client's layers [0, %d) of %s and its tail on %s, up to %d samples "
        "(kept for later runs)",
        freeze_index,
        net.arch,
        device,
        batch,
    )
    x = decoded.repeat((batch + len(images) - 1) // len(images), 1, 1, 1)[:batch].to(device)
    was_training = net.training
    net.eval()
    layers = list(net.layers)
    try:
        with torch.inference_mode():
            # As the local model runs them (folded, in the faster layout), and as the server
            # times its head (hapi_models.time_runs): the rule compares the two. Folded by a
            # folder of its own: the run's keeps its folds while the layers live, and those of
            # the layers a split leaves to the server would be dead weight.
            folder = hapi_models.BatchNormFolder(FOLDER.enabled)
            runs = folder.runs(layers[:freeze_index], x)
            # A sample warms the kernels and the allocator: a whole batch would double
            # the seconds this costs on a CPU for no better steady state.
            # Timed, it says how heavy a sample is: a heavy head is timed over fewer samples.
            per_sample = hapi_models.warm_up_runs(
                runs, x[: hapi_models.WARM_UP_SAMPLES], layouts=LAYOUTS.enabled
            )
            batch = hapi_models.timed_samples(per_sample, batch)
            times, x = hapi_models.time_runs(runs, x[:batch], layouts=LAYOUTS.enabled)
    finally:
        net.train(was_training)
    tail = copy.deepcopy(nn.Sequential(*layers[freeze_index:])).to(device).train()
    features = x.clone()  # a normal tensor: inference tensors cannot enter autograd
    labels = torch.zeros(batch, dtype=torch.int64, device=device)
    params = [p for p in tail.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9) if params else None
    train = step = 0.0
    for _ in range(2):  # the first round warms up; the second is kept
        hapi_models.sync(device)
        t0 = time.perf_counter()
        out = tail(features)
        loss = functional.cross_entropy(out.flatten(1), labels)
        if params:
            loss.backward()
        hapi_models.sync(device)
        t1 = time.perf_counter()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        hapi_models.sync(device)
        train, step = (t1 - t0) / batch, time.perf_counter() - t1
    costs = ClientCosts(decode, times, train, step, str(device))
    _client_costs[key] = costs
    write_costs(disk_key, KeptCosts(times, train, step))
    return costs


def _probe_link(
    swift: SwiftSession, source: ShardSource, link_object: tuple[str, str]
) -> float | None:
    """The link's rate for a ``folder`` dataset, from a ranged read of ``link_object`` (the
    model's weights: a large object on the same link, read as the features' streams are);
    None when the bandwidth is already known. Its per-image objects are small: one GET each
    is bound by the request's latency and Swift's per-request work, not by the link."""
    if source.layout is not DatasetLayout.FOLDER:
        return None
    if swift.bandwidth is not None and swift.bandwidth.bytes_per_s is not None:
        return None
    return swift.read_prefix(*link_object, PROBE_BYTES, max_seconds=PROBE_S)[0]


def _sample_images(
    swift: SwiftSession,
    source: ShardSource,
    stored_bytes_per_sample: float,
    link_bytes_per_s: float | None,
) -> _Sampled:
    """The first images of a shard, the link's rate and, for per-image objects, their reads'.

    A shard tar is read from its start, one ranged read that also probes the link when the
    bandwidth is not known yet (a few hundred kilobytes when it is). A ``folder`` part's images
    are read as the epoch reads them, ``OBJECT_READ_CONCURRENCY`` at a time, which gives their
    rate in objects per second at that concurrency (``link_bytes_per_s``: the link's rate,
    probed before, whose share of their time is not the reads' own). A tar whose prefix holds
    no image the strict reader knows (gzip, ``.webp``) is read whole in its layout.
    """
    if source.layout is DatasetLayout.FOLDER:
        if link_bytes_per_s is None and swift.bandwidth is not None:
            link_bytes_per_s = swift.bandwidth.bytes_per_s
        read, objects_per_s = _read_images_concurrently(
            swift, source, link_bytes_per_s, stored_bytes_per_sample
        )
        return _Sampled(read, None, objects_per_s)
    known = swift.bandwidth is not None and swift.bandwidth.bytes_per_s is not None
    wanted = int((DECODE_SAMPLES + 1) * (stored_bytes_per_sample + 1536))
    rate: float | None = None
    images: Sequence[ImageData] = []
    if not known:
        # The bandwidth probe's usual size, read for at most PROBE_S: on a slow link it may
        # hold only a few images; those are enough to time a decode.
        rate, data = swift.read_prefix(
            source.container, source.shard, max(PROBE_BYTES, wanted), max_seconds=PROBE_S
        )
        images = images_in_prefix(data, DECODE_SAMPLES)
    if not images:
        _, data = swift.read_prefix(source.container, source.shard, wanted)
        images = images_in_prefix(data, DECODE_SAMPLES)
    if images:
        return _Sampled(images, rate, None)
    samples, _ = read_source(swift, source)
    return _Sampled([s.image_bytes for s in samples[:DECODE_SAMPLES]], rate, None)


#: The relative error of the probed link rate, within which a reads' time is all the link's.
LINK_SHARE_ERROR = 0.25


def request_s_per_object(
    count: int, nbytes: int, wall_s: float, link_bytes_per_s: float | None
) -> float | None:
    """Seconds of per-request work per object, from ``count`` objects of ``nbytes`` in all read
    concurrently in ``wall_s``: the wall time less the link's share (``nbytes`` at
    ``link_bytes_per_s``), which the server, reading them next to Swift, does not pay. None
    when the link's share is all of it (link-bound reads say nothing of the requests' work)."""
    if count < 1 or wall_s <= 0:
        return None
    link_s = nbytes / link_bytes_per_s if link_bytes_per_s else 0.0
    own = wall_s - link_s
    # What is left must stand out of the link rate's own error: three 112 KB images read in
    # 0.55 s at 5 Mbit/s left 0.01 s, read as 64 requests/s, and floored the server's stage
    # at 1.2 s per iteration where it measured 0.4.
    return own / count if own > LINK_SHARE_ERROR * link_s else None


def _read_images_concurrently(
    swift: SwiftSession,
    source: ShardSource,
    link_bytes_per_s: float | None,
    bytes_per_image: float,
) -> tuple[list[bytes], float | None]:
    """The first of up to ``OBJECT_SAMPLES`` images of a ``folder`` part, read
    ``OBJECT_READ_CONCURRENCY`` at a time (none started, once the decode has its images, after
    ``OBJECT_READS_S``, and none past ``MIN_DECODE_SAMPLES`` when those started would take the
    link that long: at 5 Mbit/s the reads in flight at the deadline kept a plan 0.3 s longer,
    and eight large images 1.4 s), and the objects per second of Swift's per-request work that
    came at (None where the link's share was all of the time)."""
    data, etag = swift.get(source.container, source.shard, observe=False)
    check_pin(source, etag)
    entries = parse_part(data, source.where)[:OBJECT_SAMPLES]
    if not entries:
        raise ConfigurationError(f"{source.where} names no image to time the reads with")
    container = source.image_container
    workers = max(1, min(OBJECT_READ_CONCURRENCY, len(entries)))
    link_budget = link_bytes_per_s * OBJECT_READS_S if link_bytes_per_s else float("inf")
    began = time.perf_counter()
    ended = [began]

    def read(i_name: tuple[int, str]) -> bytes | None:
        i, name = i_name
        if i >= DECODE_SAMPLES and time.perf_counter() - began > OBJECT_READS_S:
            return None
        if i >= MIN_DECODE_SAMPLES and i * bytes_per_image > link_budget:
            return None
        # Not observed one by one: each of these short reads shares the link with the others,
        # and alone would time a fraction of it.
        got = swift.get(container, name, observe=False)[0]
        ended.append(time.perf_counter())
        return got

    with ThreadPoolExecutor(workers, "hapi-cost-reads") as pool:
        got = [b for b in pool.map(read, enumerate(e.name for e in entries)) if b is not None]
    wall = max(ended) - began
    per_object = request_s_per_object(len(got), sum(map(len, got)), wall, link_bytes_per_s)
    status.info(
        "timings: %d images of %s read %d at a time in %.2f s (%s)",
        len(got),
        source.where,
        workers,
        wall,
        "link-bound" if per_object is None else f"{1 / per_object:.0f} objects/s of requests",
    )
    return got[:DECODE_SAMPLES], None if per_object is None else 1 / per_object


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
    are read from ``swift``, the server's timings asked for through ``transport``.

    The server is asked while the client times its own layers: a cold server loads the model
    and times its head in the seconds the client's layers take, so a cold plan waits for the
    slower of the two, not for their sum. The link probe (a shard's prefix, a ``folder``
    dataset's ranged read of the weights) and a ``folder`` part's image reads run first, alone:
    they must not share Swift, or the core it runs on, with the server's reads and compute (a
    ``folder`` plan that read its images while a cold server timed its head on Swift's core
    measured 13 objects/s instead of about 100, a read floor that ranked the splits wrongly).
    """
    manifest = prepared.manifest
    source = ShardSource.of(manifest, container, 0)
    stored = prepared.stored
    freeze = prepared.freeze_index
    pool = ThreadPoolExecutor(1, "hapi-server-timings")
    try:
        probed = _probe_link(swift, source, (stored.container, stored.object))
        sampled = _sample_images(swift, source, manifest.mean_shard_bytes_per_sample, probed)
        rate = probed if probed is not None else sampled.link_bytes_per_s
        images, objects_per_s = sampled.images, sampled.objects_per_s
        if freeze == 0:
            client_costs = _time_client(prepared, images, device)
            return PipelineCosts(
                client_costs,
                None,
                "the freeze index is 0: nothing to push down",
                rate,
                objects_per_s,
            )
        asked = pool.submit(
            _timed,
            transport.timings,
            _timings_request(prepared, source, output_dtype, compression, b_max),
        )
        client_costs = _time_client(prepared, images, device)
        # Bounded: the transport's request timeout and retry policy bound the request.
        try:
            got, seconds = asked.result()
        except HapiClientError as exc:
            log.warning("the server's timings are unavailable (%s): split by Algorithm 2", exc)
            missing = f"the server's timings are unavailable: {exc}"
            return PipelineCosts(client_costs, None, missing, rate, objects_per_s)
    finally:
        # A failure of the client's own timing is raised at once, not after the server's answer.
        pool.shutdown(wait=False)
    # Said after the client's line, whichever finished first: the server's answer is the last
    # thing the decision waits for.
    status.info(
        "timings: the server's cost of layers [0, %d) %s in %.2f s",
        freeze,
        "answered from its kept timings" if got.cached else "measured",
        seconds,
    )
    server = ServerCosts(
        got.decode_s_per_sample,
        got.layer_s_per_sample,
        got.encode_s_per_sample,
        got.wire_bytes_per_sample,
        got.load,
        got.device,
        got.cached,
    )
    return PipelineCosts(client_costs, server, "", rate, objects_per_s)


def _timings_request(
    prepared: PreparedModel,
    source: ShardSource,
    output_dtype: OutputDtype,
    compression: Compression,
    b_max: int,
) -> TimingsRequest:
    freeze, stored = prepared.freeze_index, prepared.stored
    status.info(
        "timings: asking the server for the cost of layers [0, %d) of %s on its device",
        freeze,
        stored.arch,
    )
    return TimingsRequest(
        **source.request_fields(),
        model=stored.ref(),
        split_index=freeze,
        transform=TransformSpec.model_validate(prepared.transform),
        b_max=b_max,
        profile=prepared.profile_spec,
        output_dtype=output_dtype,
        compression=compression,
        samples=min(TIMING_BATCH, prepared.manifest.shards[0].samples, b_max),
    )


def _time_client(
    prepared: PreparedModel, images: Sequence[ImageData], device: torch.device
) -> ClientCosts:
    began = time.perf_counter()
    costs = measure_client_costs(
        prepared.net, prepared.transform, prepared.freeze_index, images, device
    )
    status.info(
        "timings: the client's cost of layers [0, %d) on %s ready in %.2f s",
        prepared.freeze_index,
        device,
        time.perf_counter() - began,
    )
    return costs


def _timed(
    ask: Callable[[TimingsRequest], TimingsResponse], req: TimingsRequest
) -> tuple[TimingsResponse, float]:
    began = time.perf_counter()
    got = ask(req)
    return got, time.perf_counter() - began
