"""Real transfer learning through HAPI: EfficientNet-Lite0's ImageNet features on Fashion-MNIST."""

from __future__ import annotations

import pytest

from hapi_client.datasets import get_source, upload_dataset
from hapi_client.options import ExtractOptions, TrainOptions

from .conftest import ClientEnv


@pytest.fixture(scope="module")
def fashion(client_env: ClientEnv) -> tuple[str, str]:
    conn = client_env.stack.connection()
    upload_dataset(
        conn, get_source("fashion-mnist:train?limit=2000"), "fmnist-train", progress=False
    )
    upload_dataset(conn, get_source("fashion-mnist:test?limit=500"), "fmnist-test", progress=False)
    conn.close()
    return "fmnist-train", "fmnist-test"


def test_thesis_rule_streams_tiny_images_raw(
    client_env: ClientEnv, fashion: tuple[str, str]
) -> None:
    """At the model's 224 px, every layer outputs more than a stored ~2.3 kB sample: Algorithm 2
    (``split="thesis"``) pushes nothing down, split 0."""
    with client_env.client() as client:
        result = client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=fashion[0],
            train=TrainOptions(batch_size=64),
            extract=ExtractOptions(split="thesis"),
            progress=False,
            max_iterations=1,
        )
    assert result.split is not None and result.split.split_index == 0
    assert result.split.rule == "thesis"
    assert result.history[0].split_index == 0


@pytest.mark.slow
def test_fashion_mnist_reaches_085_through_hapi(
    client_env: ClientEnv, fashion: tuple[str, str]
) -> None:
    """A linear probe on frozen Lite0 features over 1000 images reached 0.844 (machine.md);
    fine-tuning conv_head, bn2 and the classifier through HAPI at the freeze index does better.

    96 px inputs: the server's extraction of the first epoch is nearly all of this test's time,
    and at 128 px it took twice as long for no gain in three epochs (eval accuracy after
    epochs 1, 2, 3: 0.846, 0.876, 0.866 at 128 px; 0.850, 0.868, 0.872 at 96 px)."""
    with client_env.client() as client:
        result = client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=fashion[0],
            eval_container=fashion[1],
            train=TrainOptions(batch_size=64, epochs=3, optimizer="adam", lr=1e-3),
            extract=ExtractOptions(split="freeze", image_size=96),
            progress=False,
        )
    print("\neval accuracy by epoch:", [m.eval_accuracy for m in result.history])
    final = result.history[-1]
    assert final.split_index == 18
    assert final.eval_accuracy is not None and final.eval_accuracy >= 0.85, result.history
