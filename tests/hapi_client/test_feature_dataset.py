"""The feature dataset in a user's own loop, against the real Swift and a real HAPI server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hapi_models
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from hapi_client import (
    ConfigurationError,
    FeatureDataset,
    HapiClient,
    OptimizerConfig,
    VerificationError,
)
from hapi_client.datasets import get_source, upload_dataset
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_client.preparation import prepare_model
from hapi_contract import ExtractRequest

from .conftest import ClientEnv

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
OPT = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
MODEL = "efficientnet_lite0"


@pytest.fixture(scope="module")
def client(client_env: ClientEnv) -> Iterator[HapiClient]:
    with client_env.client() as c:
        yield c


@pytest.fixture(scope="module")
def uneven(client_env: ClientEnv) -> str:
    """80 samples in shards of 7: eleven of 7 and one of 3, which two ranks cannot split evenly."""
    conn = client_env.stack.connection()
    upload_dataset(
        conn,
        get_source("photos:train?per_class=8&size=96x72"),
        "uneven",
        shard_size=7,
        progress=False,
    )
    conn.close()
    return "uneven"


def _dataset(env: ClientEnv, client: HapiClient, **kw: Any) -> FeatureDataset:
    kw.setdefault("container", env.train)
    return FeatureDataset(
        client,
        model=env.models[MODEL].name,
        batch_size=8,
        split="freeze",
        transform=SMALL,
        seed=3,
        **kw,
    )


def test_own_loop_gives_the_weights_of_the_recipe(
    client_env: ClientEnv, client: HapiClient
) -> None:
    ds = _dataset(client_env, client)
    model = ds.local_model()
    assert ds.split_index == ds.freeze_index == 18
    opt = OPT.build(model.trainable_parameters())
    torch.manual_seed(3)
    for epoch in range(2):
        ds.set_epoch(epoch)
        model.train()
        # A plain loop: a DataLoader draws a base seed from torch's global RNG at every epoch,
        # which would shift the classifier's dropout masks away from the recipe's.
        for features, labels in ds:
            loss = F.cross_entropy(model(features), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    recipe = client.finetune(
        model=client_env.models[MODEL].name,
        container=client_env.train,
        train=TrainOptions.with_optimizer(OPT, batch_size=8, epochs=2, seed=3),
        extract=ExtractOptions(split="freeze"),
        transform=SMALL,
        progress=False,
    )
    ours = model.full_model().state_dict()
    for key, value in recipe.model.state_dict().items():
        # The same operations in the same order: equal up to float32 rounding.
        torch.testing.assert_close(ours[key], value, msg=key)
    assert recipe.split is not None and "freeze" in recipe.split.reason


def _signature(batches: Any) -> list[tuple[list[int], float]]:
    return [(y.tolist(), float(x.double().sum())) for x, y in batches]


def test_state_dict_resumes_mid_epoch_with_nothing_lost_or_repeated(
    client_env: ClientEnv, client: HapiClient
) -> None:
    whole = _signature(DataLoader(_dataset(client_env, client), batch_size=None))
    assert sum(len(y) for y, _ in whole) == client.manifest(client_env.train).num_samples
    first = _dataset(client_env, client)
    head = []
    for batch in first:
        head.append(batch)
        if len(head) == 4:
            break
    state = first.state_dict()
    assert state["epoch"] == 0 and state["batches_done"] == 4
    resumed = _dataset(client_env, client)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # what an epoch loop does: must not restart the epoch
    rest = _signature(resumed)
    got = _signature(head) + rest
    assert [y for y, _ in got] == [y for y, _ in whole]
    for (_, a), (_, b) in zip(got, whole, strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    assert resumed.epoch == 1  # the epoch ended: the next iteration is the next epoch
    other = _dataset(client_env, client, container=client_env.test)
    with pytest.raises(ConfigurationError, match="another run"):
        other.load_state_dict(state)


def test_a_stateful_dataloader_resumes_mid_epoch_with_nothing_lost_or_repeated(
    client_env: ClientEnv, client: HapiClient
) -> None:
    """torchdata's StatefulDataLoader, as the README recommends: its state holds the dataset's."""
    whole = _signature(DataLoader(_dataset(client_env, client), batch_size=None))
    loader = StatefulDataLoader(_dataset(client_env, client), batch_size=None)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 3:
            break
    state = loader.state_dict()
    resumed = StatefulDataLoader(_dataset(client_env, client), batch_size=None)
    resumed.load_state_dict(state)
    got = _signature(head) + _signature(resumed)
    assert [y for y, _ in got] == [y for y, _ in whole]
    for (_, a), (_, b) in zip(got, whole, strict=True):
        assert a == pytest.approx(b, rel=1e-5)


def test_two_ranks_on_uneven_shards_get_equal_batch_counts(
    client_env: ClientEnv, client: HapiClient, uneven: str
) -> None:
    ranks = [_dataset(client_env, client, container=uneven, rank=r, world_size=2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 6
    counts, samples = [], 0
    for ds in ranks:
        batches = list(ds)
        counts.append(len(batches))
        samples += sum(len(y) for _, y in batches)
        assert ds.last_counters.samples == sum(len(y) for _, y in batches)
    assert counts == [6, 6] and samples == 80


def test_verification_passes_honest_features_and_catches_altered_ones(
    client_env: ClientEnv, client_env_server_client: HapiClient
) -> None:
    client = client_env_server_client
    honest = _dataset(client_env, client, verify_fraction=1.0, cache_features=False)
    for dtype in ("float32", "float16", "bfloat16"):
        honest = _dataset(
            client_env, client, verify_fraction=1.0, cache_features=False, output_dtype=dtype
        )
        assert sum(len(y) for _, y in honest) == 80
        assert honest.verifier is not None and honest.verifier.checked_shards == 8

    extract = client.transport.extract

    def tampered(req: ExtractRequest, num_samples: int | None = None) -> Any:
        got = extract(req, num_samples)
        got.features[1:2] *= 1.1  # one sample's features scaled by 10 %: subtle, and caught
        return got

    client.transport.extract = tampered  # type: ignore[method-assign]
    altered = _dataset(client_env, client, verify_fraction=1.0, verify_samples=80)
    with pytest.raises(VerificationError, match="not to be trusted"):
        list(altered)


@pytest.fixture
def client_env_server_client(client_env: ClientEnv) -> Iterator[HapiClient]:
    """A client of its own: the verification test replaces its transport's extract."""
    with client_env.client() as c:
        yield c


@pytest.mark.parametrize(
    ("keywords", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"split": "fastest"}, "split"),
        ({"image_size": -1}, "image_size"),
        ({"output_dtype": "int8"}, "int8"),
        ({"compression": "gzip"}, "gzip"),
        ({"prefetch": 0}, "prefetch"),
    ],
)
def test_keywords_are_checked_by_the_option_objects_before_any_request(
    keywords: dict[str, object], field: str
) -> None:
    """The user's keywords go through TrainOptions and ExtractOptions: the same refusal as
    ``hapi finetune`` and the multi-worker trainer give, before the client is used at all."""
    args: dict[str, object] = {"batch_size": 8, **keywords}
    with pytest.raises(ConfigurationError, match=field):
        FeatureDataset(None, "c", "models/alexnet", preflight=False, **args)  # type: ignore[arg-type]


def test_the_options_and_the_keywords_build_the_same_dataset(
    client_env: ClientEnv, client: HapiClient
) -> None:
    """``from_options`` keeps every field of the options it is given (one construction path,
    no field lost in a repacking), and gives the dataset the same keywords give."""
    extract = ExtractOptions(
        split="freeze",
        freeze_index=18,
        image_size=64,
        output_dtype="bfloat16",  # type: ignore[arg-type]
        compression="zstd",  # type: ignore[arg-type]
        b_max=5,
        cache_features=False,
        prefetch=3,
    )
    train = TrainOptions(batch_size=8, seed=3, epochs=2)
    prepared = prepare_model(
        client,
        client_env.models[MODEL].name,
        client_env.train,
        freeze_index=extract.freeze_index,
        transform=SMALL,
        image_size=extract.image_size,
        seed=train.seed,
    )
    by_options = FeatureDataset.from_options(
        client, client_env.train, prepared, train=train, extract=extract
    )
    by_keywords = _dataset(
        client_env,
        client,
        freeze_index=18,
        image_size=64,
        output_dtype="bfloat16",
        compression="zstd",
        b_max=5,
        cache_features=False,
        prefetch=3,
        epochs=2,
    )
    assert by_options.extract == by_keywords.extract == extract
    for ds in (by_options, by_keywords):
        assert (ds.batch_size, ds.seed, ds.epochs, ds.b_max, ds.prefetch) == (8, 3, 2, 5, 3)
        assert ds.cache is None and ds.split_index == ds.freeze_index == 18
