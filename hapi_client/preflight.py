"""Before the first epoch: check in seconds what a run needs, and say in one line what to run.

:func:`preflight` makes one attempt of each check, with a short timeout and no retry budget (the
budget is for outages that begin after a run has started, :mod:`hapi_client.retry`):

1. **Swift**: the auth endpoint answers and accepts the credentials;
2. **the dataset containers** (training, and held-out where given) exist, and each holds a valid
   manifest;
3. **the model**: its descriptor ``CONTAINER/ARCH.json`` and its weights object exist, and the
   architecture is one this client knows;
4. **the HAPI server** (``via="hapi"``: ``GET /healthz`` answers 200) or **Swift's HAPI filter**
   (``via="swift"``: the proxy's ``/info`` lists it); not for ``mode="baseline"``, which needs
   neither.

The first failed check raises the client's typed error (:class:`~hapi_client.SwiftUnavailableError`,
:class:`~hapi_client.SwiftAccessError`, :class:`~hapi_client.ServerUnavailableError`,
:class:`~hapi_client.ConfigurationError`) whose message is one line: what is wrong, then the
command that fixes it (``hapi stack up``, ``hapi upload dataset ...``, ``hapi upload model ...``).
The recipe (:func:`~hapi_client.finetune.run_finetune`), :class:`~hapi_client.FeatureDataset`
(when it prepares its model itself) and the multi-worker launcher run it.
"""

from __future__ import annotations

import difflib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import hapi_models
import httpx
from swiftclient.client import ClientException, Connection

from hapi_contract import HEALTH_PATH, MANIFEST_NAME, InvalidManifestError, parse_manifest
from hapi_contract.layouts import image_kind_of_name

from .errors import (
    ConfigurationError,
    HapiClientError,
    ServerUnavailableError,
    SwiftAccessError,
    SwiftUnavailableError,
)
from .retry import failure_kind
from .swift_session import SwiftCredentials, short_reason

if TYPE_CHECKING:
    from .client import HapiClient
    from .model_store import StoredModel

__all__ = ["PREFLIGHT_TIMEOUT_S", "PreflightReport", "preflight"]

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")

#: Seconds each check waits for an answer: a healthy local stack answers in milliseconds.
PREFLIGHT_TIMEOUT_S = 10.0

_STACK_UP = "is the stack up? run `hapi stack up`"
# Enough for a hint; one listing request each, only on the way to a refusal.
_LISTED_CONTAINERS = 1000
_LISTED_OBJECTS = 100


@dataclass
class PreflightReport:
    """What :func:`preflight` checked (all passed) and how long it took."""

    seconds: float = 0.0
    checked: list[str] = field(default_factory=list)


def preflight(
    client: HapiClient,
    *,
    model: str | StoredModel,
    containers: Sequence[str | None],
    mode: str = "hapi",
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
) -> PreflightReport:
    """Check what a run of ``model`` on ``containers`` in ``mode`` needs; see the module docstring.

    Raises the first failure's typed error (a :class:`~hapi_client.HapiClientError`) with a
    one-line message naming what to run.
    """
    start = time.perf_counter()
    report = PreflightReport()
    creds = client.credentials
    conn = Connection(
        authurl=creds.auth_url, user=creds.user, key=creds.key, retries=0, timeout=timeout_s
    )
    try:
        _swift(conn, creds)
        report.checked.append(f"Swift at {creds.auth_url} as {creds.user}")
        for container in dict.fromkeys(c for c in containers if c):
            samples, shards = _dataset(conn, creds, container)
            report.checked.append(f"{container} ({samples} samples in {shards} shards)")
        report.checked.append(f"model {_model(conn, creds, model)}")
    finally:
        conn.close()
    if mode != "baseline":
        report.checked.append(_server(client, mode, timeout_s))
    report.seconds = time.perf_counter() - start
    status.info("preflight ok in %.2f s: %s", report.seconds, "; ".join(report.checked))
    return report


def _swift(conn: Connection, creds: SwiftCredentials) -> None:
    try:
        conn.get_auth()
    except Exception as exc:  # swiftclient: ClientException, requests' errors
        status_code = getattr(exc, "http_status", None)
        if status_code == 401:
            raise SwiftAccessError(
                f"Swift at {creds.auth_url} rejected the credentials of {creds.user} (401): give "
                "the right --user/--key (or ST_USER/ST_KEY)"
            ) from exc
        if status_code == 503:
            raise SwiftUnavailableError(
                f"Swift auth at {creds.auth_url} answered 503: its memcached (tempauth's token "
                "store) is likely down: run `hapi stack up`",
                endpoint="auth",
                status=503,
            ) from exc
        if status_code is not None:
            raise SwiftUnavailableError(
                f"Swift auth at {creds.auth_url} answered {status_code}: see the Swift logs",
                endpoint="auth",
                status=status_code,
            ) from exc
        raise SwiftUnavailableError(
            f"Swift: {_unreachable(exc, creds.auth_url)}",
            endpoint="auth",
            status=None,
        ) from exc


def _unreachable(exc: BaseException, url: str) -> str:
    kind = failure_kind(exc)
    if kind == "refused":
        return f"nothing listens at {url}: {_STACK_UP}"
    if kind == "timeout":
        return "no answer in time: is it overloaded or hung?"
    if kind == "cut":
        return "the connection was cut mid-response"
    return f"{short_reason(exc)}; {_STACK_UP}"


def _refused(exc: ClientException, creds: SwiftCredentials, what: str) -> HapiClientError:
    """A Swift failure after a successful login, as one line."""
    code = exc.http_status
    if code == 403:
        return SwiftAccessError(f"{creds.user} may not read {what} (403)")
    if code is None:
        return SwiftUnavailableError(
            f"cannot read {what}: {_unreachable(exc, creds.auth_url)}",
            endpoint="storage",
            status=None,
        )
    return SwiftUnavailableError(
        f"Swift answered {code} for {what}: see the Swift logs", endpoint="storage", status=code
    )


def _similar_container(conn: Connection, container: str) -> str:
    """``; did you mean 'X'?`` for a mistyped container name, from the account's listing."""
    try:
        _, listing = conn.get_account(limit=_LISTED_CONTAINERS)
    except ClientException:  # a hint only: the 404 is the answer
        return ""
    close = difflib.get_close_matches(container, [c["name"] for c in listing], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _layout_seen(conn: Connection, container: str) -> str:
    """The in-place layout the first objects of a container without a manifest suggest."""
    try:
        _, listing = conn.get_container(container, limit=_LISTED_OBJECTS)
    except ClientException:
        return "folder|webdataset"
    names = [row["name"] for row in listing]
    if any(name.lower().endswith((".tar", ".tar.gz", ".tgz")) for name in names):
        return "webdataset"
    if any(image_kind_of_name(name) is not None for name in names):
        return "folder"
    return "folder|webdataset"


def _dataset(conn: Connection, creds: SwiftCredentials, container: str) -> tuple[int, int]:
    upload = f"`hapi upload dataset --source SPEC --container {container}`"
    try:
        conn.head_container(container)
    except ClientException as exc:
        if exc.http_status == 404:
            raise SwiftAccessError(
                f"dataset container {container} does not exist in Swift (404)"
                f"{_similar_container(conn, container)}: upload a dataset with {upload}"
            ) from exc
        raise _refused(exc, creds, f"container {container}") from exc
    try:
        _, body = conn.get_object(container, MANIFEST_NAME)
    except ClientException as exc:
        if exc.http_status == 404:
            index = f"`hapi dataset index --container {container} --layout {_layout_seen(conn, container)}`"
            raise SwiftAccessError(
                f"container {container} holds no dataset ({MANIFEST_NAME} is missing): index "
                f"the images or WebDataset shards it holds in place with {index}, or upload a "
                f"dataset with {upload} (an interrupted upload or index: run it again)"
            ) from exc
        raise _refused(exc, creds, f"{container}/{MANIFEST_NAME}") from exc
    try:
        manifest = parse_manifest(body)
    except InvalidManifestError as exc:
        raise SwiftAccessError(
            f"{container}/{MANIFEST_NAME} is not a valid dataset manifest ({exc}): upload the "
            f"dataset again with {upload}"
        ) from exc
    return manifest.num_samples, len(manifest.shards)


def _known(arch: str) -> bool:
    try:
        hapi_models.get_spec(arch)
    except hapi_models.HapiModelError:
        return False
    return True


def _model(conn: Connection, creds: SwiftCredentials, ref: str | StoredModel) -> str:
    from .model_store import StoredModel

    if isinstance(ref, StoredModel):
        stored = ref
    else:
        container, _, name = ref.partition("/")
        if not container or not name:
            raise ConfigurationError(
                f"model reference {ref!r} must look like 'models/efficientnet_lite0'"
            )
        upload = f"`hapi upload model --arch {name}" + (
            f" --container {container}`" if container != "models" else "`"
        )
        descriptor = f"{container}/{name}.json"
        try:
            _, body = conn.get_object(container, f"{name}.json")
        except ClientException as exc:
            if exc.http_status == 404:
                raise SwiftAccessError(
                    f"model {ref} is not in Swift ({descriptor}: 404): "
                    + (
                        f"upload it with {upload}"
                        if _known(name)
                        else "upload one with `hapi upload model --arch ARCH` (`hapi models` "
                        "lists the architectures)"
                    )
                ) from exc
            raise _refused(exc, creds, descriptor) from exc
        try:
            stored = StoredModel(**json.loads(body))
        except (TypeError, ValueError) as exc:
            raise SwiftAccessError(
                f"{descriptor} is not a model descriptor ({exc}): upload the model again with "
                f"{upload}"
            ) from exc
    if not _known(stored.arch):
        raise ConfigurationError(
            f"model {stored.name} is a {stored.arch!r}, which this client does not know "
            "(`hapi models` lists the architectures it knows; a plugin's must be installed here too)"
        )
    try:
        conn.head_object(stored.container, stored.object)
    except ClientException as exc:
        if exc.http_status == 404:
            raise SwiftAccessError(
                f"the weights of model {stored.name} ({stored.container}/{stored.object}) are "
                f"missing: upload the model again with `hapi upload model --arch {stored.arch}`"
            ) from exc
        raise _refused(exc, creds, f"{stored.container}/{stored.object}") from exc
    return f"{stored.name} ({stored.arch})"


def _server(client: HapiClient, mode: str, timeout_s: float) -> str:
    transport = client.transport
    checked = []
    # ALL_IN_COS fine-tuning always goes to the server itself, even via="swift".
    if transport.via == "hapi" or mode == "all_in_cos":
        url = f"{transport.endpoint}{HEALTH_PATH}"
        try:
            resp = httpx.get(url, timeout=timeout_s)
        except httpx.HTTPError as exc:
            kind = "timeout" if isinstance(exc, httpx.TimeoutException) else failure_kind(exc)
            reason = {
                "refused": f"nothing listens at {transport.endpoint}: {_STACK_UP}",
                "timeout": f"{transport.endpoint} did not answer within {timeout_s:g} s: is it "
                "overloaded or hung?",
                "cut": f"{transport.endpoint} cut the connection mid-response",
            }.get(kind, f"cannot reach {transport.endpoint} ({exc}); {_STACK_UP}")
            raise ServerUnavailableError(
                f"the HAPI server: {reason} (or give --endpoint / HAPI_ENDPOINT)"
            ) from exc
        if resp.status_code == 503:
            swift_url = _json_field(resp, "swift_url") or "its Swift"
            raise ServerUnavailableError(
                f"the HAPI server at {transport.endpoint} cannot read Swift at {swift_url} "
                f"({HEALTH_PATH} answered 503): {_STACK_UP}",
                status=503,
            )
        if resp.status_code != 200:
            raise ServerUnavailableError(
                f"{url} answered {resp.status_code}: is {transport.endpoint} a HAPI server? "
                "(give --endpoint / HAPI_ENDPOINT); if it is, the server answered "
                f"{resp.status_code}: see its log",
                status=resp.status_code,
            )
        checked.append(f"HAPI server at {transport.endpoint}")
    if transport.via == "swift" and mode != "all_in_cos":
        storage_url, _ = client.swift.auth()
        base = storage_url.split("/v1/", 1)[0]
        # Refuses a proxy without the filter, or one that does not serve extraction.
        transport.check_filter(storage_url, "extract")
        checked.append(f"HAPI filter of the Swift proxy at {base}")
    return ", ".join(checked)


def _json_field(resp: httpx.Response, name: str) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    value = body.get(name) if isinstance(body, dict) else None
    return str(value) if value else None
