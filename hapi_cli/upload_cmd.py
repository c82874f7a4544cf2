"""``hapi upload dataset``: put a dataset (shards + manifest) into a Swift container.

Other upload kinds (e.g. ``hapi upload model``) are added to the same ``upload`` parser with
:func:`add_upload_subcommand`, which gives them the Swift connection options; their ``func`` gets
a ready :class:`swiftclient.client.Connection` from :func:`connect`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from hapi_contract.dataset import DEFAULT_SHARD_SIZE

from .choices import DEFAULT_AUTH_URL, SOURCE_SPEC_HELP
from .parsers import RawDescriptionDefaultsHelpFormatter, parent_parser

if TYPE_CHECKING:
    from swiftclient.client import Connection

__all__ = [
    "DEFAULT_AUTH_URL",
    "DEFAULT_KEY",
    "DEFAULT_USER",
    "ERRORS",
    "UPLOAD_SUBPARSERS",
    "add_upload_subcommand",
    "connect",
    "register",
    "swift_options",
]

DEFAULT_USER = "test:tester"
DEFAULT_KEY = "testing"
# hapi_client loads torch, so the handlers import it; DatasetError and DatasetFormatError count as
# user errors by their package (see main).
ERRORS: tuple[type[BaseException], ...] = ()

#: The ``upload`` parser's subparsers, set by :func:`register`.
UPLOAD_SUBPARSERS: argparse._SubParsersAction[argparse.ArgumentParser] | None = None


def swift_options() -> argparse.ArgumentParser:
    """A parent parser with ``--auth-url/--user/--key/--retries/--timeout``."""
    parent = parent_parser()
    group = parent.add_argument_group("Swift (tempauth v1)")
    group.add_argument("--auth-url", help=f"auth URL (default: $ST_AUTH, else {DEFAULT_AUTH_URL})")
    group.add_argument("--user", help=f"account:user (default: $ST_USER, else {DEFAULT_USER})")
    group.add_argument("--key", help=f"password (default: $ST_KEY, else {DEFAULT_KEY})")
    group.add_argument(
        "--retries", type=int, default=3, help="retries per request (default: %(default)s)"
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for Swift per request (default: %(default)s)",
    )
    return parent


def connect(args: argparse.Namespace) -> Connection:
    """A Connection from the parsed Swift options, authenticated once up front.

    Authenticating first (without retries) turns an unreachable Swift or wrong credentials into
    one clear error before any work starts.

    Raises:
        SwiftUnavailableError: Swift does not answer (the message says to run `hapi stack up`).
        SwiftAuthError: wrong user or key.
    """
    from swiftclient.client import Connection

    from hapi_client.datasets import swift_errors

    conn = Connection(
        authurl=args.auth_url or os.environ.get("ST_AUTH") or DEFAULT_AUTH_URL,
        user=args.user or os.environ.get("ST_USER") or DEFAULT_USER,
        key=args.key or os.environ.get("ST_KEY") or DEFAULT_KEY,
        retries=max(0, args.retries),
        starting_backoff=0.5,
        timeout=args.timeout,
    )
    with swift_errors(conn, "authenticate"):
        conn.get_auth()
    return conn


def add_upload_subcommand(name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """Add ``hapi upload NAME`` (with the Swift options) and return its parser.

    ``kwargs`` go to ``add_parser`` (help, description...). Set ``func`` on the result.
    """
    if UPLOAD_SUBPARSERS is None:
        raise RuntimeError("hapi_cli.upload_cmd.register() has not run yet")
    parents = [*kwargs.pop("parents", []), swift_options()]
    return UPLOAD_SUBPARSERS.add_parser(name, parents=parents, **kwargs)


def _megabytes(count: float) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"


def _upload_dataset(args: argparse.Namespace) -> int:
    from hapi_client.datasets import DatasetError, get_source, sync_dataset

    if args.shard_size < 1:
        raise DatasetError(f"--shard-size must be >= 1, got {args.shard_size}")
    conn = connect(args)  # first: an unreachable Swift should fail before any slow source work
    try:
        source = get_source(args.source)
        progress = sys.stderr.isatty() if args.progress is None else args.progress
        result = sync_dataset(
            conn, source, args.container, shard_size=args.shard_size, progress=progress
        )
    finally:
        conn.close()
    manifest = result.manifest
    print(
        f"dataset {args.container!r}: {manifest.num_samples} samples, "
        f"{manifest.num_classes} classes, {len(manifest.shards)} shards of up to "
        f"{manifest.shard_size}, {_megabytes(manifest.total_bytes)}"
    )
    print(
        f"  mean stored bytes/sample: {manifest.mean_image_bytes_per_sample:,.0f} B image only, "
        f"{manifest.mean_shard_bytes_per_sample:,.0f} B per sample of shard tar"
    )
    print(
        f"  uploaded {result.shards_uploaded} shards ({_megabytes(result.bytes_uploaded)}), "
        f"skipped {result.shards_skipped} unchanged, manifest "
        f"{'uploaded' if result.manifest_uploaded else 'unchanged'}, "
        f"{len(result.stale_deleted)} stale shards deleted"
    )
    print(f"  {result.seconds:.1f} s; source: {manifest.source}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``upload`` (with its ``dataset`` kind) to the ``hapi`` parser."""
    global UPLOAD_SUBPARSERS
    upload = subparsers.add_parser(
        "upload",
        help="upload data into Swift",
        description="Upload datasets (or other objects) into Swift, idempotently.",
    )
    UPLOAD_SUBPARSERS = upload.add_subparsers(dest="upload_kind", metavar="KIND", required=True)
    dataset = add_upload_subcommand(
        "dataset",
        help="a dataset as fixed-size tar shards plus manifest.json",
        description="Cut a source into WebDataset-style tar shards and upload them and a "
        "manifest into CONTAINER. Re-running with the same source uploads nothing; a changed "
        "source replaces the shards and the manifest and deletes stale shards.",
        epilog=SOURCE_SPEC_HELP,
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    dataset.add_argument(
        "--source", required=True, metavar="SPEC", help="what to upload: a source spec (below)"
    )
    dataset.add_argument("--container", required=True, help="the Swift container (dataset name)")
    dataset.add_argument(
        "--shard-size",
        type=int,
        default=DEFAULT_SHARD_SIZE,
        help="samples per shard (default: %(default)s)",
    )
    dataset.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    dataset.set_defaults(func=_upload_dataset)
