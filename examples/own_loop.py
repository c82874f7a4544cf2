"""Fine-tune through HAPI in your own PyTorch loop: AMP on a GPU, a learning-rate schedule, checkpoints.

Against the local stack (`hapi stack up`, then `hapi upload dataset ...` and `hapi upload model ...`):

    python examples/own_loop.py --model models/efficientnet_lite0 \
        --container photos-train --eval-container photos-test --epochs 3

Run it again with the same --checkpoint and it resumes where it stopped, in the middle of an
epoch if it was interrupted there: the dataset's state travels in the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import hapi_models
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from hapi_client import FeatureDataset, HapiClient, SwiftCredentials


def main() -> None:
    args = _parse()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    credentials = SwiftCredentials(args.auth_url, args.user, args.key)
    with HapiClient(args.endpoint, credentials) as client:
        train = FeatureDataset(
            client,
            args.container,
            args.model,
            batch_size=args.batch_size,
            split=args.split,
            image_size=args.image_size,
            seed=args.seed,
        )
        print(f"split {train.split_index} ({train.decision.reason}); freeze {train.freeze_index}")
        model = train.local_model(device)  # a plain nn.Module that takes the features
        opt = torch.optim.AdamW(model.trainable_parameters(), lr=args.lr)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=args.lr, total_steps=args.epochs * len(train)
        )
        # Mixed precision where a GPU is present; on a CPU the loop runs in float32.
        scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
        checkpoint = Path(args.checkpoint)
        if checkpoint.exists():  # resume: model, optimizer, schedule and the dataset's position
            state = torch.load(checkpoint, map_location=device, weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            scaler.load_state_dict(state["scaler"])
            train.load_state_dict(state["dataset"])
            print(f"resumed at epoch {train.epoch + 1}, batch {state['dataset']['batches_done']}")

        for epoch in range(train.epoch, args.epochs):
            train.set_epoch(epoch)
            model.train()
            start, seen, correct, total_loss = time.perf_counter(), 0, 0, 0.0
            for step, (features, labels) in enumerate(DataLoader(train, batch_size=None)):
                features, labels = features.to(device), labels.to(device)
                with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
                    logits = model(features)
                    loss = F.cross_entropy(logits, labels)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                schedule.step()
                seen += len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                total_loss += loss.item() * len(labels)
                if args.stop_after is not None and step + 1 == args.stop_after:
                    _save(checkpoint, model, opt, schedule, scaler, train)
                    print(
                        f"stopped after {step + 1} batches of epoch {epoch + 1}; checkpoint saved"
                    )
                    return
            _save(checkpoint, model, opt, schedule, scaler, train)
            line = (
                f"epoch {epoch + 1}: loss {total_loss / seen:.3f}, train accuracy {correct / seen:.3f}, "
                f"{time.perf_counter() - start:.1f} s, {train.last_counters.wire_bytes / 1e6:.1f} MB received"
            )
            if args.eval_container:
                line += f", held-out accuracy {_evaluate(client, args, train, model, device):.3f}"
            print(line)

        out = Path(args.output)
        digest = hapi_models.save_weights(model.full_model().cpu(), out)
        print(
            f"saved {out} (sha256 {digest[:12]}...); upload it with: "
            f"hapi upload model --arch {train.prepared.stored.arch} --weights {out}"
        )


def _evaluate(
    client: HapiClient,
    args: argparse.Namespace,
    train: FeatureDataset,
    model: torch.nn.Module,
    device: str,
) -> float:
    held_out = FeatureDataset(
        client,
        args.eval_container,
        args.model,
        batch_size=args.batch_size,
        split=train.split_index,
        image_size=args.image_size,
        seed=args.seed,
        shuffle=False,
    )
    model.eval()
    correct = seen = 0
    with torch.inference_mode():
        for features, labels in held_out:
            correct += int((model(features.to(device)).argmax(1).cpu() == labels).sum())
            seen += len(labels)
    return correct / seen


def _save(path: Path, model, opt, schedule, scaler, train: FeatureDataset) -> None:  # type: ignore[no-untyped-def]
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "schedule": schedule.state_dict(),
        "scaler": scaler.state_dict(),
        "dataset": train.state_dict(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash while saving never leaves half a checkpoint


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
    p.add_argument("--eval-container")
    p.add_argument(
        "--split", default="auto", type=lambda s: s if s in ("auto", "thesis", "freeze") else int(s)
    )
    p.add_argument("--image-size", type=int)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--checkpoint", default="checkpoint.pt", help="saved after every epoch; resumed from"
    )
    p.add_argument("--output", default="finetuned.safetensors", help="the whole fine-tuned model")
    p.add_argument("--stop-after", type=int, help="stop after this many batches (to try resuming)")
    return p.parse_args()


if __name__ == "__main__":
    main()
