"""Setting up one rank: device, backend, credentials, and the replica of the model it trains.

Every rank prepares the same model (:func:`~hapi_client.preparation.prepare_model`), rank 0
plans the split and broadcasts it (:func:`~hapi_client.planning.plan_split`, as the feature
dataset does), and rank 0's trainable parameters and buffers are broadcast so that all replicas
start identical.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import hapi_models
import torch
import torch.distributed as dist
from torch import nn

from hapi_contract import Compression, DatasetManifest, OutputDtype, ProfileSpec

from ..client import HapiClient
from ..model_store import StoredModel
from ..planning import plan_split
from ..preparation import PreparedModel, cos_batch_cap, prepare_model
from ..swift_session import DEFAULT_AUTH_URL, SwiftCredentials
from .config import DistributedConfig
from .errors import DistributedConfigError
from .replica import trainable_parameters

__all__ = [
    "Collectives",
    "PreparedModels",
    "Replica",
    "backend_for",
    "credentials_or_env",
    "memory_used",
    "resolve_device",
    "setup_replica",
]

log = logging.getLogger(__name__)


def credentials_or_env(given: SwiftCredentials | None) -> SwiftCredentials:
    """``given``, else the credentials in ``ST_AUTH``/``ST_USER``/``ST_KEY`` (or the defaults)."""
    if given is not None:
        return given
    return SwiftCredentials(
        os.environ.get("ST_AUTH") or DEFAULT_AUTH_URL,
        os.environ.get("ST_USER") or "test:tester",
        os.environ.get("ST_KEY") or "testing",
    )


def resolve_device(config: DistributedConfig) -> torch.device:
    """The device this rank trains on ("cuda" and "auto" pick the GPU of the local rank)."""
    if config.device == "cpu":
        return torch.device("cpu")
    if config.device.startswith("cuda:"):
        return torch.device(config.device)
    if not torch.cuda.is_available():
        if config.device == "cuda":
            raise DistributedConfigError("device 'cuda' was asked for but CUDA is not available")
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", local % torch.cuda.device_count())


def backend_for(config: DistributedConfig, device: torch.device) -> str:
    """gloo on CPU; on GPU gloo for host tensors plus NCCL for device tensors."""
    if config.backend == "gloo" or device.type != "cuda":
        if config.backend == "nccl":
            raise DistributedConfigError("backend 'nccl' needs a CUDA device")
        return "gloo"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if config.backend == "auto" and torch.cuda.device_count() < local_world:
        # NCCL refuses two ranks on one GPU; fall back to gloo through host memory.
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def memory_used(device: torch.device) -> float:
    """Fraction of the device's memory in use (host memory on CPU), for LB-BSP's memory guard."""
    if device.type == "cuda":
        free, capacity = torch.cuda.mem_get_info(device)
        return 1.0 - free / capacity if capacity else 0.0
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        info = dict(line.split(":", 1) for line in lines if ":" in line)
        total = float(info["MemTotal"].split()[0])
        available = float(info["MemAvailable"].split()[0])
        return 1.0 - available / total if total else 0.0
    except (OSError, KeyError, ValueError):
        return 0.0


class Collectives:
    """Broadcasts from rank 0 that work whether the backend takes device tensors or not."""

    def __init__(self, device: torch.device) -> None:
        self.device_tensors = device.type == "cuda" and "nccl" in str(dist.get_backend())

    def broadcast(self, t: torch.Tensor) -> None:
        """Overwrite ``t`` with rank 0's ``t`` (through host memory under gloo on a GPU)."""
        if self.device_tensors or t.device.type == "cpu":
            dist.broadcast(t, src=0)
            return
        host = t.detach().cpu()
        dist.broadcast(host, src=0)
        t.copy_(host)


@dataclass
class Replica:
    """This rank's copy of the model and what its data needs (identical on every rank)."""

    stored: StoredModel
    manifest: DatasetManifest
    eval_manifest: DatasetManifest | None
    transform: hapi_models.InputTransform
    profile_spec: ProfileSpec
    dtype: OutputDtype
    compression: Compression
    split: int
    freeze: int
    net: hapi_models.SplittableModel
    #: Layers ``[split, freeze)``: run on the client without gradients.
    frozen: nn.Module
    #: Layers ``[freeze, n)``: the part every worker trains.
    trainable: nn.Module
    params: list[nn.Parameter]
    buffers: list[torch.Tensor]
    optimizer: torch.optim.Optimizer

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)


def _prepare(client: HapiClient, cfg: DistributedConfig) -> PreparedModel:
    return prepare_model(
        client,
        cfg.model,
        cfg.container,
        num_classes=cfg.num_classes,
        freeze_index=cfg.extract.freeze_index,
        image_size=cfg.extract.image_size,
        seed=cfg.train.seed,
    )


class PreparedModels:
    """The model a sequence of runs prepared last (:func:`~.trainer.run_sequence`), so that a
    sweep over rules or balancing reads, checks and builds it once per rank rather than once per
    run: each run trains its own copy. One is kept (a sweep shares its model), so the memory it
    holds is one model's.
    """

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._kept: PreparedModel | None = None

    def get(self, client: HapiClient, cfg: DistributedConfig) -> PreparedModel:
        """``cfg``'s prepared model: a fresh copy of the kept one when preparing it depends on
        the same things (model, dataset, classes, freeze index, input size, seed)."""
        ex = cfg.extract
        key: tuple[object, ...] = (cfg.model, cfg.container, cfg.num_classes, ex.freeze_index)
        key += (ex.image_size, cfg.train.seed)
        if self._kept is None or key != self._key:
            self._key, self._kept = key, None
            self._kept = _prepare(client, cfg)
        return dataclasses.replace(self._kept, net=copy.deepcopy(self._kept.net))


def setup_replica(
    client: HapiClient,
    config: DistributedConfig,
    rank: int,
    device: torch.device,
    collectives: Collectives,
    models: PreparedModels | None = None,
    *,
    world_size: int = 1,
) -> Replica:
    """Prepare the model (from ``models`` when a sequence shares it), agree on the split and
    start every replica from rank 0's weights. The split is planned for ``world_size`` ranks
    each taking its share of an epoch, as the feature dataset plans it: a rank's epoch is a
    ``world_size``-th of the samples, so a plan for the whole dataset per rank overweighted
    the per-iteration costs against the decision and the pipeline's filling."""
    cfg = config
    prepared = _prepare(client, cfg) if models is None else models.get(client, cfg)
    eval_manifest = None
    if rank == 0 and cfg.eval_container:
        eval_manifest = client.manifest(cfg.eval_container)
    freeze = prepared.freeze_index
    split = 0
    if cfg.mode != "baseline":
        plan = plan_split(
            client,
            prepared,
            cfg.container,
            cfg.extract.split,
            batch_size=cfg.train.batch_size,
            output_dtype=cfg.extract.output_dtype,
            compression=cfg.extract.compression,
            b_max=cos_batch_cap(prepared.manifest, cfg.extract.b_max, cfg.train.batch_size),
            device=device,
            rank=rank,
            world_size=world_size,
            collective=True,
            epochs=cfg.train.epochs,
            cached=cfg.extract.cache_features,
        )
        split = plan.decision.split_index
        if rank == 0:
            logging.getLogger("hapi_client.status").info(
                "split %d: %s", split, plan.decision.reason
            )
    net = prepared.net.to(device)
    hapi_models.prepare_for_finetuning(net, freeze)
    trainable = net.tail(freeze)
    params = trainable_parameters(net)
    buffers = list(trainable.buffers())
    for t in [*params, *buffers]:
        collectives.broadcast(t.data)
    return Replica(
        stored=prepared.stored,
        manifest=prepared.manifest,
        eval_manifest=eval_manifest,
        transform=prepared.transform,
        profile_spec=prepared.profile_spec,
        dtype=cfg.extract.output_dtype,
        compression=cfg.extract.compression,
        split=split,
        freeze=freeze,
        net=net,
        frozen=nn.Sequential(*net.layers[split:freeze]),
        trainable=trainable,
        params=params,
        buffers=buffers,
        optimizer=cfg.train.optimizer_config().build(params),
    )
