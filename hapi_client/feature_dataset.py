"""HAPI in the user's own training loop: a dataset of split-layer features and the model's local half.

>>> ds = FeatureDataset(client, "photos-train", "models/resnet18", batch_size=64)
>>> model = ds.local_model(device="cuda")       # layers [split, n); [split, freeze) frozen
>>> opt = torch.optim.SGD(model.trainable_parameters(), lr=0.01)
>>> for epoch in range(3):
...     ds.set_epoch(epoch)
...     for features, labels in DataLoader(ds, batch_size=None):
...         loss = F.cross_entropy(model(features.to("cuda")), labels.to("cuda"))
...         opt.zero_grad(); loss.backward(); opt.step()
>>> hapi_models.save_weights(model.full_model(), "finetuned.safetensors")

The dataset yields exact training batches (every sample once per epoch, in an order fixed by
``seed`` and the epoch), prefetched on its own threads; what only HAPI does stays inside: the
split chosen from the measured bandwidth (and re-chosen at an epoch boundary when it drifts),
the feature pushdown with the server's batch adaptation, the feature cache and, optionally,
local verification of the pushdown.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

import hapi_models
import torch
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from hapi_contract import (
    DEFAULT_COMPRESSION,
    DEFAULT_OUTPUT_DTYPE,
    Compression,
    DatasetManifest,
    OutputDtype,
    ShardSource,
)

from .errors import ConfigurationError
from .feature_cache import FeatureCache
from .frozen_layers import run_frozen
from .model_store import StoredModel
from .options import ExtractOptions, TrainOptions, prefetch_depth
from .pipeline import EpochCounters, ShardLoader, iterate_batches, plan_epoch, rank_share
from .planning import PipelineCosts, SplitChoice, SplitDecision, plan_split
from .preflight import preflight as run_preflight
from .preparation import PreparedModel, cos_batch_cap, prepare_model
from .shard_loaders import PushdownVerifier, make_shard_loader

if TYPE_CHECKING:
    from .client import HapiClient

__all__ = ["FeatureDataset", "LocalModel"]

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")

Batch = tuple[torch.Tensor, torch.Tensor]
_STATE_VERSION = 1


class LocalModel(nn.Module):
    """The compute-tier half of a split model: it takes the features of layer ``split``.

    It runs layers ``[split, n)``: ``[split, freeze)`` frozen and kept in eval mode (their
    batch-norm statistics stay the pretrained ones, whatever ``train()`` says), ``[freeze, n)``
    trainable. It holds the whole model (the layers before ``split`` are frozen and unused), so
    that :meth:`full_model` is one call and a re-split at an epoch boundary only moves
    :attr:`split`. A plain ``nn.Module``: wrap it in DDP, compile it, checkpoint it as usual.
    """

    def __init__(self, model: hapi_models.SplittableModel, split: int, freeze_index: int) -> None:
        super().__init__()
        if not 0 <= split <= freeze_index < model.num_layers:
            raise ConfigurationError(
                f"need 0 <= split ({split}) <= freeze ({freeze_index}) < {model.num_layers}"
            )
        self.model = model
        self.split = split
        self.freeze_index = freeze_index
        hapi_models.prepare_for_finetuning(model, freeze_index)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = features
        frozen = self.model.layers[self.split : self.freeze_index]
        if len(frozen):
            x = run_frozen(self.model.arch, self.split, self.freeze_index, frozen, x)
        for layer in self.model.layers[max(self.split, self.freeze_index) :]:
            x = layer(x)
        return x

    def train(self, mode: bool = True) -> LocalModel:
        super().train(mode)
        hapi_models.set_modes(self.model, self.freeze_index, training=mode)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters of layers ``[freeze, n)``: what an optimizer should get."""
        return [p for p in self.parameters() if p.requires_grad]

    def full_model(self) -> hapi_models.SplittableModel:
        """The whole model with the trained weights (shared, not copied): save or upload it."""
        return self.model


class FeatureDataset(IterableDataset[Batch]):
    """Training batches ``(features at the split, labels)`` of a Swift dataset container.

    Args:
        client: an open :class:`~hapi_client.HapiClient` (Swift credentials, HAPI endpoint).
        container: the dataset container (shards + manifest, ``hapi upload dataset``).
        model: a stored model, ``"container/arch"`` or a :class:`StoredModel`.
        batch_size: samples per batch (per rank). Batches are exact: every one is
            ``batch_size`` samples except the last ones of an epoch.
        split: ``"auto"`` (the split with the smallest predicted time per iteration, from the
            server's and the client's measured costs and the measured bandwidth; re-checked at
            each epoch boundary when the bandwidth drifts), ``"thesis"`` (thesis Algorithm 2 on
            the measured bandwidth), ``"freeze"`` or a layer index; ``mode="baseline"`` means
            split 0.
        mode: ``"hapi"`` (pushdown) or ``"baseline"`` (raw shards decoded locally).
        freeze_index: layers before it stay frozen (default: the architecture's).
        num_classes: classifier size (default: the dataset's class count).
        transform, image_size: the input transform (default: the model's), at another crop size.
        seed: the epoch order and the new classifier's initialisation.
        shuffle: shuffle shards and samples per epoch (False: stored order, for evaluation).
        rank, world_size: this process's part of each epoch (default: from
            ``torch.distributed`` when it is initialised, else 0 and 1). Every rank reads its
            own shards and gets the same number of batches.
        output_dtype, compression: how features travel (``float32``/``float16``/``bfloat16``;
            ``none``/``zstd``).
        b_max: the largest COS batch the server may use (default: the training batch, at most
            one shard and 1000).
        cache_features: keep features of the frozen split in memory for later epochs.
        epochs: the epochs the caller will run: ``split="auto"`` ranks the splits by the whole
            job's predicted time (later epochs from the feature cache when it is on).
        prefetch: shards loaded ahead (default: enough for one batch, at least 2).
        verify_fraction: fraction of shards whose features are recomputed locally
            (``verify_samples`` samples each); a mismatch raises
            :class:`~hapi_client.VerificationError`. Verified samples are counted in
            :attr:`last_counters`; a fraction that draws none of the shards is warned about.
        preflight: check Swift, the container, the model and the server in seconds before
            anything else (:func:`~hapi_client.preflight.preflight`); only when the dataset
            prepares its model itself (not with ``prepared``, whose maker checked).
        evaluation: a held-out pass of a training run, at the split the training uses: its
            status lines say so (an evaluation pass, the training's split) instead of an
            epoch's and a split decided by the caller.

    Use it directly in a ``for`` loop or through ``DataLoader(ds, batch_size=None)`` with
    ``num_workers=0`` (the dataset prefetches on its own threads). After an epoch ends the next
    iteration starts the next epoch; :meth:`set_epoch` sets it explicitly, as with
    ``DistributedSampler``. :meth:`state_dict` / :meth:`load_state_dict` resume in the middle of
    an epoch with nothing lost or repeated (``torchdata``'s ``StatefulDataLoader`` calls them):
    the resumed epoch ends on the split it was saved with, and the next epoch's split is
    planned afresh, as a new dataset's would be.
    """

    def __init__(
        self,
        client: HapiClient,
        container: str,
        model: str | StoredModel,
        *,
        batch_size: int,
        split: SplitChoice = "auto",
        mode: Literal["hapi", "baseline"] = "hapi",
        freeze_index: int | None = None,
        num_classes: int | None = None,
        transform: hapi_models.InputTransform | None = None,
        image_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        output_dtype: str | OutputDtype = DEFAULT_OUTPUT_DTYPE,
        compression: str | Compression = DEFAULT_COMPRESSION,
        b_max: int | None = None,
        cache_features: bool = True,
        prefetch: int | None = None,
        verify_fraction: float = 0.0,
        verify_samples: int = 4,
        prepared: PreparedModel | None = None,
        preflight: bool = True,
        evaluation: bool = False,
        epochs: int = 1,
    ) -> None:
        # A user's own loop passes keywords; they become the option objects every other way of
        # training builds (so each rule is checked once), and the one setup reads only those.
        train = TrainOptions(batch_size=batch_size, seed=seed, epochs=epochs)
        extract = ExtractOptions(
            split=split,
            freeze_index=freeze_index,
            image_size=image_size,
            # Strings are accepted there and stored as the enums.
            output_dtype=output_dtype,  # type: ignore[arg-type]
            compression=compression,  # type: ignore[arg-type]
            b_max=b_max,
            cache_features=cache_features,
            prefetch=prefetch,
        )
        self._setup(
            client,
            container,
            model,
            train=train,
            extract=extract,
            mode=mode,
            num_classes=num_classes,
            transform=transform,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            verify_fraction=verify_fraction,
            verify_samples=verify_samples,
            prepared=prepared,
            preflight=preflight,
            evaluation=evaluation,
        )

    @classmethod
    def from_options(
        cls,
        client: HapiClient,
        container: str,
        prepared: PreparedModel,
        *,
        train: TrainOptions,
        extract: ExtractOptions,
        mode: Literal["hapi", "baseline"] = "hapi",
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        verify_fraction: float = 0.0,
        verify_samples: int = 4,
        evaluation: bool = False,
    ) -> FeatureDataset:
        """The dataset of a prepared model (:func:`~hapi_client.preparation.prepare_model`,
        which applied ``extract``'s freeze index and crop size) under the shared options."""
        # The options are checked objects already: skip __init__'s keywords, not the setup.
        dataset = cls.__new__(cls)
        dataset._setup(
            client,
            container,
            prepared.stored,
            train=train,
            extract=extract,
            mode=mode,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            verify_fraction=verify_fraction,
            verify_samples=verify_samples,
            prepared=prepared,
            evaluation=evaluation,
        )
        return dataset

    def _setup(
        self,
        client: HapiClient,
        container: str,
        model: str | StoredModel,
        *,
        train: TrainOptions,
        extract: ExtractOptions,
        mode: Literal["hapi", "baseline"],
        num_classes: int | None = None,
        transform: hapi_models.InputTransform | None = None,
        shuffle: bool,
        rank: int | None,
        world_size: int | None,
        verify_fraction: float,
        verify_samples: int,
        prepared: PreparedModel | None,
        preflight: bool = True,
        evaluation: bool,
    ) -> None:
        """The one construction: both front doors (keywords, option objects) end here. Of
        ``train`` it reads the batch size, the seed and the epochs only."""
        super().__init__()
        if mode not in ("hapi", "baseline"):
            raise ConfigurationError(f"mode must be 'hapi' or 'baseline', got {mode!r}")
        self.epochs = train.epochs
        self.evaluation = evaluation
        self.extract = extract
        self.output_dtype = extract.output_dtype
        self.compression = extract.compression
        self.client = client
        self.container = container
        self.batch_size = train.batch_size
        self.mode = mode
        self.seed = train.seed
        self.shuffle = shuffle
        # With the rank read from torch.distributed, rank 0's split choice is every rank's (the
        # measured bandwidths differ) and decided collectively: construct and iterate on all.
        self._collective = rank is None and world_size is None and _distributed()
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        if prepared is None and preflight:
            run_preflight(client, model=model, containers=[container], mode=mode)
        self.prepared = prepared or prepare_model(
            client,
            model,
            container,
            num_classes=num_classes,
            freeze_index=extract.freeze_index,
            transform=transform,
            image_size=extract.image_size,
            seed=train.seed,
        )
        self.b_max = cos_batch_cap(self.prepared.manifest, extract.b_max, train.batch_size)
        self.cache = FeatureCache() if extract.cache_features and mode == "hapi" else None
        self.prefetch = prefetch_depth(
            extract.prefetch,
            train.batch_size,
            self.prepared.manifest.shard_size,
            # The server orders its sends; the Swift filter's relay and raw reads do not.
            ordered=mode == "hapi" and client.transport.via == "hapi",
        )
        self.verifier = (
            PushdownVerifier(
                client.swift,
                self.prepared.net,
                self.prepared.transform,
                verify_fraction,
                verify_samples,
                train.seed,
            )
            if verify_fraction > 0 and mode == "hapi"
            else None
        )
        self._split_choice: SplitChoice = 0 if mode == "baseline" else extract.split
        self._costs: PipelineCosts | None = None
        # Resumed on a saved split other than the planned one: plan afresh at the next epoch.
        self._replan = False
        self.decision = self._plan()
        self._verify_warned: set[int] = set()  # splits whose empty verification was warned
        self._epoch = 0
        self._position = 0  # batches of the current epoch already yielded
        self._locals: weakref.WeakSet[LocalModel] = weakref.WeakSet()
        self.last_counters = EpochCounters()
        len(self)  # refuses at once a share that cannot work (fewer shards than ranks...)

    # -- what the user reads ------------------------------------------------------------------

    @property
    def manifest(self) -> DatasetManifest:
        return self.prepared.manifest

    @property
    def split_index(self) -> int:
        return self.decision.split_index

    @property
    def freeze_index(self) -> int:
        return self.prepared.freeze_index

    @property
    def num_classes(self) -> int:
        return self.prepared.num_classes

    @property
    def epoch(self) -> int:
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank)."""
        sizes = [s.samples for s in self.manifest.shards]
        order = range(len(sizes))
        return len(rank_share(order, sizes, self.batch_size, self.rank, self.world_size)[1])

    def local_model(self, device: torch.device | str = "cpu") -> LocalModel:
        """The model half that takes this dataset's features, moved to ``device``.

        The same module on every call (it follows the dataset's split when it changes).
        """
        for existing in self._locals:
            return existing.to(device)
        local = LocalModel(self.prepared.net, self.split_index, self.freeze_index).to(device)
        self._locals.add(local)
        return local

    # -- epochs and resumption -----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next, in its own order (from ``seed`` and ``epoch``).

        Another epoch than the current one starts at its beginning; the current one goes on
        where it stands, so a run resumed with :meth:`load_state_dict` can call ``set_epoch``
        at the top of its epoch loop as usual.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigurationError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch != self._epoch:
            self._position = 0
        self._epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: restore it with :meth:`load_state_dict` to resume."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches_done": self._position,
            "split_index": self.split_index,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_samples": self.manifest.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration continues the saved epoch after its last yielded batch.

        The rest of that epoch streams at the saved split (the features already delivered came
        from it); at the next epoch boundary the split is planned as for a new dataset.
        """
        if state.get("version") != _STATE_VERSION:
            raise ConfigurationError(
                f"unknown FeatureDataset state version {state.get('version')!r}"
            )
        mine = self.state_dict()
        for key in ("seed", "batch_size", "rank", "world_size", "num_samples"):
            if state.get(key) != mine[key]:
                raise ConfigurationError(
                    f"the saved state has {key}={state.get(key)!r} where this dataset has "
                    f"{mine[key]!r}: it belongs to another run"
                )
        saved = int(state["split_index"])
        if saved != self.split_index:
            # The saved epoch's batches so far came from split ``saved``: the rest of it comes
            # from there too; the next epoch is planned like a fresh dataset's.
            if not 0 <= saved <= self.freeze_index:
                raise ConfigurationError(
                    f"the saved split {saved} is not in [0, freeze index {self.freeze_index}]"
                )
            self.decision = SplitDecision(
                saved,
                f"resumed in epoch {state['epoch']} on its saved split (planned afresh at the "
                "next epoch boundary)",
                0.0,
                0.0,
                0.0,
                (),
                "forced",
            )
            self._replan = True
            self._follow_split()
        self._epoch = int(state["epoch"])
        self._position = int(state["batches_done"])

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        if get_worker_info() is not None:
            raise ConfigurationError(
                "FeatureDataset prefetches on its own threads: use DataLoader(ds, batch_size=None) "
                "with num_workers=0"
            )
        manifest = self.manifest
        sizes = [s.samples for s in manifest.shards]
        if self._position == 0:
            self._maybe_resplit()
        if self._position >= len(self):  # the saved epoch was complete: start the next
            self._epoch, self._position = self._epoch + 1, 0
            self._maybe_resplit()
        epoch = self._epoch
        plan = plan_epoch(len(sizes), self.seed, epoch, shuffle=self.shuffle)
        shards, batch_sizes = rank_share(
            plan.shard_order, sizes, self.batch_size, self.rank, self.world_size
        )
        loader = self._loader(self.split_index)
        counters = EpochCounters()
        self._check_verification([ShardSource.of(manifest, self.container, k) for k in shards])
        log.info(
            "epoch %d (rank %d/%d): %d batches from batch %d, split %d",
            epoch,
            self.rank,
            self.world_size,
            len(batch_sizes),
            self._position,
            self.split_index,
        )
        began = time.perf_counter()
        first = True
        with ThreadPoolExecutor(self.prefetch, thread_name_prefix="hapi-prefetch") as pool:
            batches = iterate_batches(
                plan,
                sizes,
                loader,
                self.batch_size,
                pool,
                self.prefetch,
                counters,
                permute=self.shuffle,
                shards=shards,
                batch_sizes=batch_sizes,
                start_batch=self._position,
            )
            for batch in batches:
                if first:
                    first = False
                    status.info(
                        "evaluation pass %d: first batch %.2f s after the pass began"
                        if self.evaluation
                        else "epoch %d: first batch %.2f s after the epoch began",
                        epoch,
                        time.perf_counter() - began,
                    )
                self._position += 1
                self.last_counters = counters
                yield batch
        self.last_counters = counters
        self._epoch, self._position = epoch + 1, 0

    def _loader(self, split: int) -> ShardLoader:
        p = self.prepared
        return make_shard_loader(
            self.client.swift,
            self.client.transport,
            p.manifest,
            self.container,
            split=split,
            transform=p.transform,
            stored=p.stored if self.mode == "hapi" else None,
            profile_spec=p.profile_spec,
            b_max=self.b_max,
            output_dtype=self.output_dtype,
            compression=self.compression,
            cache=self.cache,
            verifier=self.verifier,
        )

    def _check_verification(self, sources: list[ShardSource]) -> None:
        """Warn once per split when verification is on but draws none of this rank's shards."""
        verifier, split = self.verifier, self.split_index
        if verifier is None or split == 0 or split in self._verify_warned:
            return
        if verifier.drawn(sources, split) == 0:
            self._verify_warned.add(split)
            log.warning(
                "verify_fraction=%g draws none of the %d shards at split %d: nothing will be "
                "verified (use at least %.2g to expect one shard)",
                verifier.fraction,
                len(sources),
                split,
                1 / max(1, len(sources)),
            )

    def _plan(self, current: SplitDecision | None = None) -> SplitDecision:
        began = time.perf_counter()
        plan = plan_split(
            self.client,
            self.prepared,
            self.container,
            self._split_choice,
            batch_size=self.batch_size,
            output_dtype=self.output_dtype,
            compression=self.compression,
            b_max=self.b_max,
            costs=self._costs,
            current=current,
            rank=self.rank,
            world_size=self.world_size,
            collective=self._collective and self.world_size > 1,
            # At an epoch boundary, what is left of the job.
            epochs=max(1, self.epochs - getattr(self, "_epoch", 0)),
            cached=self.cache is not None,
        )
        # Measured once per run; a re-plan at an epoch boundary reuses them.
        self._costs = plan.costs or self._costs
        if self.evaluation:
            # Nothing was decided here: the training's split is reused, whoever chose it.
            status.info(
                "evaluation at split %d (freeze %d): the training's split, not decided again",
                plan.decision.split_index,
                self.freeze_index,
            )
        elif current is None or plan.decision.split_index != current.split_index:
            status.info(
                "split %d (freeze %d) decided in %.2f s: %s",
                plan.decision.split_index,
                self.freeze_index,
                time.perf_counter() - began,
                plan.decision.reason,
            )
        return plan.decision

    def _maybe_resplit(self) -> None:
        """At an epoch boundary: plan afresh after a resumption, else re-plan on a drift."""
        if self._replan:
            self._replan = False
            self.decision = self._plan()
        elif self._split_choice in ("auto", "thesis"):
            self.decision = self._plan(current=self.decision)
        self._follow_split()

    def _follow_split(self) -> None:
        for local in self._locals:
            local.split = self.split_index

    def __getstate__(self) -> dict[str, Any]:
        raise ConfigurationError(
            "FeatureDataset holds a live HAPI client and cannot be pickled: use "
            "DataLoader(ds, batch_size=None) with num_workers=0 (it prefetches on its own threads)"
        )


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None:
        if _distributed():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ConfigurationError("give both rank and world_size, or neither")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigurationError(f"rank {rank} out of range for world size {world_size}")
    return rank, world_size
