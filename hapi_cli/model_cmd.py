"""``hapi upload model``: store a model's safetensors weights and descriptor in Swift."""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import TYPE_CHECKING

from hapi_contract.requests import ARCH_PATTERN

from .parsers import RawDescriptionDefaultsHelpFormatter
from .upload_cmd import add_upload_subcommand, connect

if TYPE_CHECKING:
    from swiftclient.client import Connection

# hapi_client loads torch, so _upload_model imports it; hapi_models' errors count as user errors
# by their package (see main).
__all__ = ["register"]


def _stored_sha256(conn: Connection, container: str, arch: str) -> str | None:
    """The sha256 in the descriptor of a model stored before, or None where there is none."""
    from swiftclient.exceptions import ClientException

    from hapi_client.datasets import swift_errors

    with swift_errors(conn, f"GET {container}/{arch}.json"):
        try:
            _, body = conn.get_object(container, f"{arch}.json")
        except ClientException as exc:
            if exc.http_status == 404:  # no such container or descriptor
                return None
            raise
    try:
        sha = json.loads(body).get("sha256")
    except (ValueError, AttributeError):  # not a descriptor: it is replaced all the same
        return "unreadable"
    return str(sha) if sha else None


def _arch_name(value: str) -> str:
    # The name's form only, without torch; whether the registry knows it is checked next.
    if not re.fullmatch(ARCH_PATTERN, value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an architecture name ([a-z0-9_], or FAMILY/NAME as timm/convnext_atto)"
        )
    return value


def _upload_model(args: argparse.Namespace) -> int:
    import hapi_models

    from hapi_client import upload_model
    from hapi_client.model_store import PACKAGED_WEIGHTS, TORCHVISION_WEIGHTS

    # Before connecting: an unknown architecture is refused with the registry's names.
    hapi_models.get_spec(args.arch)
    if args.weights not in (None, PACKAGED_WEIGHTS, TORCHVISION_WEIGHTS):
        # Before connecting: a file that cannot be a checkpoint (text, a device, too large...)
        # is refused at once, reading only its first bytes.
        hapi_models.check_checkpoint(args.weights)
    conn = connect(args)
    start = time.perf_counter()
    try:
        previous = _stored_sha256(conn, args.container, args.arch)
        stored, uploaded = upload_model(
            conn,
            args.arch,
            container=args.container,
            weights=args.weights,
            num_classes=args.num_classes,
            seed=args.seed,
        )
    finally:
        conn.close()
    print(
        f"model {stored.name}: {stored.arch}, {stored.num_classes} classes, {stored.nbytes / 1e6:.1f} MB"
    )
    print(f"  object  {stored.container}/{stored.object}")
    print(f"  sha256  {stored.sha256}")
    if stored.random_seed is not None:
        # The how-to is the library's warning on stderr; this line keeps the summary honest.
        print(f"  weights RANDOM initialisation (seed {stored.random_seed}), not pretrained")
    seconds = f"in {time.perf_counter() - start:.1f} s"
    if not uploaded:
        print(f"  already stored, nothing sent {seconds}")
    elif previous is not None and previous != stored.sha256:
        print(f"  replaced the model stored before (its sha256 was {previous}) {seconds}")
    else:
        print(f"  uploaded {seconds}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    del subparsers  # `model` hangs under `hapi upload`, created by hapi_cli.upload_cmd
    parser = add_upload_subcommand(
        "model",
        help="model weights (safetensors) plus a descriptor",
        description="Store ARCH's weights as CONTAINER/ARCH.safetensors with their sha256 and a "
        "descriptor CONTAINER/ARCH.json. Without --weights: the packaged ImageNet weights where the "
        "architecture has them (efficientnet_lite0), else a seeded random initialisation.",
        epilog="examples:\n"
        "  hapi upload model --arch resnet18 --weights torchvision\n"
        "  hapi upload model --arch resnet18 --weights resnet18-f37072fd.pth\n"
        "  hapi upload model --arch alexnet --weights my-finetuned.safetensors",
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--arch",
        required=True,
        metavar="ARCH",
        type=_arch_name,
        help="a registry architecture: `hapi models` lists them (the thesis' seven and every "
        "torchvision classification network); any timm model as timm/NAME",
    )
    parser.add_argument(
        "--weights",
        metavar="FILE|torchvision|imagenet",
        help="a checkpoint of the architecture (.safetensors, or a torch .pth/.pt/.ckpt state "
        "dict read with weights_only=True; native torchvision/timm key names or HAPI's), "
        "'torchvision' for torchvision's default pretrained weights (torch's hub cache, else a "
        "download), or 'imagenet' for the packaged weights (efficientnet_lite0)",
    )
    parser.add_argument(
        "--container",
        default="models",
        help="the Swift container of the weights and the descriptor (default: %(default)s)",
    )
    parser.add_argument(
        "--num-classes",
        type=int,
        help="classes of a randomly initialised head (default 1000); with --weights, the "
        "checkpoint's own count is used",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of a random initialisation (without --weights; default: %(default)s)",
    )
    parser.set_defaults(func=_upload_model)
