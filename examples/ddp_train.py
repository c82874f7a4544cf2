"""Data-parallel fine-tuning through HAPI with torch's DistributedDataParallel, launched by torchrun.

    torchrun --nproc_per_node 2 examples/ddp_train.py --model models/efficientnet_lite0 \
        --container photos-train --epochs 2

Each rank streams the features of its own shards (FeatureDataset reads the rank and world size
from torch.distributed) and every rank gets the same number of batches, even when the shards
do not divide evenly, so DDP's all-reduce never waits on a rank that ran out. NCCL with a GPU
per rank, else gloo on the CPU. Every rank prints the sha256 of its parameters; rank 0 saves
the fine-tuned model.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import time

import hapi_models
import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from hapi_client import FeatureDataset, HapiClient, SwiftCredentials


def main() -> None:
    args = _parse()
    # NCCL needs a GPU of its own per rank; with fewer GPUs than local ranks, gloo on the CPU.
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    try:
        _train(args, device, cuda)
        # Every rank leaves together: none tears its group down while another still uses it.
        dist.barrier()
    finally:
        # The DDP wrapper holds a reference to the process group. It went out of scope with
        # _train; collecting it here, and not at interpreter exit (where gloo's worker threads
        # can outlive the interpreter and abort the process, as CI saw once), lets destroy
        # drop the last reference while the interpreter is whole.
        gc.collect()
        dist.destroy_process_group()


def _train(args: argparse.Namespace, device: torch.device, cuda: bool) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    credentials = SwiftCredentials(args.auth_url, args.user, args.key)
    with HapiClient(args.endpoint, credentials) as client:
        # Rank and world size come from torch.distributed; with split="auto" rank 0 measures
        # and chooses the split, and every rank uses it.
        train = FeatureDataset(
            client,
            args.container,
            args.model,
            batch_size=args.batch_size,
            split=args.split,
            image_size=args.image_size,
            seed=args.seed,
        )
        local = train.local_model(device)
        model = DistributedDataParallel(local, device_ids=[device.index] if cuda else None)
        opt = torch.optim.SGD(local.trainable_parameters(), lr=args.lr, momentum=0.9)
        for epoch in range(args.epochs):
            train.set_epoch(epoch)
            model.train()
            start, seen, batches, total_loss = time.perf_counter(), 0, 0, 0.0
            for features, labels in train:
                features, labels = features.to(device), labels.to(device)
                loss = F.cross_entropy(model(features), labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()  # DDP all-reduces the gradients here
                opt.step()
                seen += len(labels)
                batches += 1
                total_loss += loss.item() * len(labels)
            # On the training device: NCCL reduces only CUDA tensors.
            totals = torch.tensor([seen, batches, total_loss], dtype=torch.float64, device=device)
            dist.all_reduce(totals)
            if rank == 0:
                _say(
                    f"epoch {epoch + 1}: {int(totals[0])} samples in {batches} batches per rank "
                    f"x {world} ranks, loss {totals[2] / totals[0]:.3f}, "
                    f"{time.perf_counter() - start:.1f} s"
                )
            _say(f"rank {rank}: {seen} samples, {batches} batches")
        full = local.full_model().cpu()
        _say(f"rank {rank}: parameters sha256 {_parameters_digest(full)}")
        if rank == 0:
            digest = hapi_models.save_weights(full, args.output)
            _say(f"saved {args.output} (sha256 {digest[:12]}...)")


def _parameters_digest(model: torch.nn.Module) -> str:
    # DDP keeps the parameters equal on every rank; the digests show it. Not the buffers:
    # DDP sends rank 0's BatchNorm statistics before each forward, which then updates them
    # with the rank's own batch, so they differ after the last step (rank 0's are saved).
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _say(line: str) -> None:
    # One write per line: the ranks share the terminal, and a line split across writes
    # (print writes the text and the newline apart) could interleave with another rank's.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--endpoint", default="http://127.0.0.1:8090", help="HAPI server")
    p.add_argument("--auth-url", default="http://127.0.0.1:8080/auth/v1.0")
    p.add_argument("--user", default="test:tester")
    p.add_argument("--key", default="testing")
    p.add_argument("--model", default="models/efficientnet_lite0")
    p.add_argument("--container", default="photos-train")
    p.add_argument(
        "--split", default="auto", type=lambda s: s if s in ("auto", "thesis", "freeze") else int(s)
    )
    p.add_argument("--image-size", type=int)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="finetuned-ddp.safetensors")
    return p.parse_args()


if __name__ == "__main__":
    main()
