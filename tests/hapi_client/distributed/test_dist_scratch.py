from __future__ import annotations

import time

from hapi_client.datasets import get_source, upload_dataset
from hapi_client.distributed import DistributedConfig, launch


def test_scratch(client_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    conn = client_env.stack.connection()
    t = time.perf_counter()
    upload_dataset(conn, get_source("fashion-mnist:train?limit=2100"), "fmnist-train", shard_size=100, progress=False)
    upload_dataset(conn, get_source("fashion-mnist:test?limit=1000"), "fmnist-test", shard_size=100, progress=False)
    print("upload", time.perf_counter() - t)
    cfg = DistributedConfig(
        model=client_env.models["efficientnet_lite0"].name, container="fmnist-train", eval_container="fmnist-test",
        endpoint=client_env.server.url, image_size=64, split=21, freeze_index=21, batch_size=35, epochs=4,
        lr=0.05, momentum=0.9, aggregator="average", f=1, seed=0,
    )
    t = time.perf_counter()
    res = launch(7, cfg, credentials=client_env.credentials, log_path=tmp_path / "log.txt", log_level="info")
    print("run", time.perf_counter() - t)
    for m in res.history:
        print(m)
    print((tmp_path / "log.txt").read_text()[-3000:])
