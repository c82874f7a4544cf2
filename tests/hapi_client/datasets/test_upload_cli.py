"""``hapi upload dataset`` through the real CLI entry point."""

from __future__ import annotations

import argparse
import socket
import uuid
from pathlib import Path

import pytest

import hapi_cli.upload_cmd as upload_cmd
from hapi_cli.main import build_parser, main
from hapi_client.datasets import load_manifest
from hapi_stack import RunningStack


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _swift_args(stack: RunningStack, key: str | None = None) -> list[str]:
    return [
        "--auth-url", stack.auth_url,
        "--user", stack.admin_user,
        "--key", key or stack.admin_key,
        "--retries", "0",
    ]  # fmt: skip


def test_unreachable_swift_says_to_start_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/auth/v1.0"
    code = main(["upload", "dataset", "--source", "digits", "--container", "x", "--auth-url", url])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("hapi: error: ")
    assert "connection refused" in err and "hapi stack up" in err and url in err


def test_env_variables_are_the_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/auth/v1.0"
    monkeypatch.setenv("ST_AUTH", url)
    monkeypatch.setenv("ST_USER", "someone:else")
    assert main(["upload", "dataset", "--source", "digits", "--container", "x"]) == 2
    assert url in capsys.readouterr().err


def test_upload_without_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["upload"]) == 2
    assert "KIND" in capsys.readouterr().err


@pytest.mark.swift
def test_wrong_credentials(swift_stack: RunningStack, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["upload", "dataset", "--source", "digits", "--container", "x"]
    code = main([*args, *_swift_args(swift_stack, key="wrong")])
    err = capsys.readouterr().err
    assert code == 2
    assert "401 Unauthorized" in err and "test:tester" in err and err.count("\n") == 1


@pytest.mark.swift
def test_unreadable_folder(
    swift_stack: RunningStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"folder:{tmp_path / 'missing'}"
    code = main(
        ["upload", "dataset", "--source", spec, "--container", "x", *_swift_args(swift_stack)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and err.count("\n") == 1


@pytest.mark.swift
def test_bad_spec(swift_stack: RunningStack, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["upload", "dataset", "--source", "mnist", "--container", "x", *_swift_args(swift_stack)]
    )
    assert code == 2 and "unknown source 'mnist'" in capsys.readouterr().err


@pytest.mark.swift
def test_upload_then_reupload(
    swift_stack: RunningStack, capsys: pytest.CaptureFixture[str]
) -> None:
    container = f"cli-{uuid.uuid4().hex[:10]}"
    argv = [
        "upload", "dataset", "--source", "digits:test?limit=30", "--container", container,
        "--shard-size", "20", "--no-progress", *_swift_args(swift_stack),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"dataset '{container}': 30 samples, 10 classes, 2 shards of up to 20" in out
    assert "uploaded 2 shards" in out and "manifest uploaded" in out
    assert "B image only" in out and "B per sample of shard tar" in out

    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "uploaded 0 shards (0.0 kB), skipped 2 unchanged, manifest unchanged" in out

    conn = swift_stack.connection()
    try:
        assert load_manifest(conn, container).num_samples == 30
    finally:
        conn.close()


def test_other_commands_can_join_the_upload_parser() -> None:
    def register_model(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        upload_cmd.register(subparsers)
        model = upload_cmd.add_upload_subcommand("model", help="model weights")
        model.add_argument("--weights", required=True)
        model.set_defaults(func=lambda args: 0)

    class Module:
        register = staticmethod(register_model)

    args = build_parser([Module()]).parse_args(  # type: ignore[list-item]
        ["upload", "model", "--weights", "w.safetensors", "--user", "u:v"]
    )
    assert (args.upload_kind, args.weights, args.user, args.retries) == (
        "model",
        "w.safetensors",
        "u:v",
        3,
    )
