"""Helper of ``scripts/swift_functional.sh``: the proxy and test configs, and the comparison.

``proxy-conf``  writes a proxy config on the storage servers of a running stack: like the stack's
                own proxy (``hapi_stack.render_proxy_conf``), on another port, with the HAPI filter
                absent (``plain``), forwarding to the stack's HAPI server (``decoupled``) or
                running extractions itself (``in_proxy``), and with the tempauth users Swift's
                functional tests want beyond the stack's two. ``--pipeline saio`` replaces the
                stack's pipeline by that of Swift's SAIO proxy config (the filter, when present,
                right after ``tempauth`` as in the stack's).
``accounts``    creates the suite's accounts (a POST as each owner), as on a cluster that has
                been used: an account that does not exist yet answers HEAD with a fake 200
                listing where the suite expects 204.
``check-info``  checks the proxy's ``/info``: no ``hapi`` entry for ``plain``, else the mode's
                ``execution`` (the filter really is in the pipeline, in that mode).
``test-conf``   writes the ``test.conf`` of Swift's functional tests for a proxy URL.
``compare``     reads the runs' JUnit XML files, prints per run the passed/failed/skipped counts
                and time, then the symmetric differences of the sets; exits 1 if they differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
import xml.etree.ElementTree as ET
from itertools import combinations
from pathlib import Path

from hapi_stack import StackConfig, render_proxy_conf, running_stack

MODES = ("plain", "decoupled", "in_proxy")
#: Test ids printed at most per list.
SHOW = 50

#: Options set in ``[filter:tempauth]``: what Swift's sample ``test.conf`` wants beyond the stack's
#: users. ``test2:tester2`` must own its account (``.admin``; the stack's has no admin rights), and
#: the suite also logs in as ``test:tester3`` (no admin rights), as the service-token user
#: ``test5:tester5`` (group ``service``, required on ``SERVICE_`` accounts) and as the reseller
#: admin ``test:tester6``.
TEMPAUTH = {
    "reseller_prefix": "AUTH, SERVICE",
    "SERVICE_require_group": "service",
    "user_test2_tester2": "testing2 .admin",
    "user_test_tester3": "testing3",
    "user_test5_tester5": "testing5 service",
    "user_test_tester6": "testing6 .reseller_admin",
}

#: The pipeline of Swift's SAIO proxy config (doc/saio/swift/proxy-server.conf in Swift's source)
#: without ``keymaster encryption``, and the sections of the filters the stack's config lacks, as
#: SAIO configures them. Encrypted objects carry more metadata than ext4 gives an inode's xattrs
#: (SAIO wants XFS): with encryption, most object PUTs of the UTF-8 tests fail with a 507 on ext4.
SAIO_PIPELINE = (
    "catch_errors gatekeeper healthcheck proxy-logging cache etag-quoter listing_formats bulk "
    "tempurl ratelimit crossdomain container_sync tempauth {hapi}staticweb copy container-quotas "
    "account-quotas slo dlo versioned_writes symlink proxy-logging proxy-server"
)
SAIO_FILTERS = {
    "etag-quoter": {"use": "egg:swift#etag_quoter", "enable_by_default": "false"},
    "bulk": {"use": "egg:swift#bulk"},
    "tempurl": {"use": "egg:swift#tempurl"},
    "ratelimit": {"use": "egg:swift#ratelimit"},
    "crossdomain": {"use": "egg:swift#crossdomain"},
    "container_sync": {"use": "egg:swift#container_sync", "current": "//saio/saio_endpoint"},
    "staticweb": {"use": "egg:swift#staticweb"},
    "container-quotas": {"use": "egg:swift#container_quotas"},
    "account-quotas": {"use": "egg:swift#account_quotas"},
    "versioned_writes": {
        "use": "egg:swift#versioned_writes",
        "allow_versioned_writes": "true",
        "allow_object_versioning": "true",
    },
    "symlink": {"use": "egg:swift#symlink"},
}

#: ``account:user``, key of the account owners whose accounts ``accounts`` creates.
OWNERS = (("test:tester", "testing"), ("test2:tester2", "testing2"))

TEST_CONF = """\
# Written by scripts/swift_functional.py for one proxy.
[func_test]
auth_uri = {url}/auth/v1.0
account = test
username = tester
password = testing
account2 = test2
username2 = tester2
password2 = testing2
username3 = tester3
password3 = testing3
account5 = test5
username5 = tester5
password5 = testing5
service_prefix = SERVICE
account6 = test
username6 = tester6
password6 = testing6
collate = C
insecure = no

[swift-constraints]
# none: the suite takes them from the proxy's /info
"""


def proxy_conf(state_dir: Path, mode: str, port: int, pipeline: str = "stack") -> str:
    """The text of a proxy config for ``mode`` on ``port``, on the stack in ``state_dir``."""
    stack = running_stack(StackConfig(state_dir=state_dir)).config
    update: dict[str, object] = {"proxy_port": port}
    if mode == "plain":
        update |= {"hapi_server": False, "proxy_extra_pipeline": [], "proxy_extra_filters": {}}
    elif mode == "decoupled":
        if not stack.hapi_server:
            raise SystemExit("decoupled needs a stack started with its HAPI server")
        update |= {"proxy_extra_filters": {"hapi": {"execution": "decoupled"}}}
    else:
        update |= {
            "proxy_extra_pipeline": ["hapi"],
            "proxy_extra_filters": {"hapi": {"execution": "in_proxy", "torch_threads": "1"}},
        }
    text = render_proxy_conf(stack.model_copy(update=update))
    head, anchor, rest = text.partition("[filter:tempauth]\n")
    section, _, tail = rest.partition("\n\n")
    if not anchor or "use = egg:swift#tempauth" not in section:
        raise SystemExit("the proxy config has no [filter:tempauth] section; hapi_stack changed?")
    options = dict(line.split(" = ", 1) for line in section.splitlines() if " = " in line)
    options |= TEMPAUTH
    section = "".join(f"{key} = {value}\n" for key, value in options.items())
    text = head + anchor + section + "\n" + tail
    if pipeline == "saio":
        lines = text.splitlines(keepends=True)
        [index] = [i for i, line in enumerate(lines) if line.startswith("pipeline = ")]
        hapi = "hapi " if mode != "plain" else ""
        lines[index] = f"pipeline = {SAIO_PIPELINE.format(hapi=hapi)}\n"
        text = "".join(lines) + "".join(
            f"\n[filter:{name}]\n" + "".join(f"{k} = {v}\n" for k, v in options.items())
            for name, options in SAIO_FILTERS.items()
            if f"[filter:{name}]" not in text
        )
    has_filter = "[filter:hapi]" in text
    if has_filter != (mode != "plain"):
        raise SystemExit(f"{mode}: [filter:hapi] {'present' if has_filter else 'absent'}")
    return text


def check_info(url: str, mode: str) -> str:
    """What ``/info`` says of the filter; SystemExit if it does not match ``mode``."""
    with urllib.request.urlopen(f"{url}/info", timeout=30) as resp:
        info = json.load(resp)
    hapi = info.get("hapi")
    execution = hapi.get("execution") if isinstance(hapi, dict) else None
    if (mode == "plain" and hapi is not None) or (mode != "plain" and execution != mode):
        raise SystemExit(f"{mode}: /info says hapi = {hapi!r}")
    return "no hapi filter" if hapi is None else f"hapi filter, execution = {execution}"


def create_accounts(url: str) -> None:
    """POST to each owner's account: the proxy creates it (``account_autocreate``)."""
    for user, key in OWNERS:
        request = urllib.request.Request(
            f"{url}/auth/v1.0", headers={"X-Auth-User": user, "X-Auth-Key": key}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            token, storage = resp.headers["X-Auth-Token"], resp.headers["X-Storage-Url"]
        post = urllib.request.Request(storage, method="POST", headers={"X-Auth-Token": token})
        with urllib.request.urlopen(post, timeout=30) as resp:
            if resp.status != 204:
                raise SystemExit(f"POST {storage} as {user}: {resp.status}")


def outcomes(junit: Path) -> tuple[dict[str, set[str]], float]:
    """``{"passed"|"failed"|"skipped": test ids}`` and pytest's own time, from a JUnit file."""
    sets: dict[str, set[str]] = {"passed": set(), "failed": set(), "skipped": set()}
    root = ET.parse(junit).getroot()
    seconds = sum(float(s.get("time", 0)) for s in root.iter("testsuite"))
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            sets["failed"].add(test_id)
        elif case.find("skipped") is not None:
            sets["skipped"].add(test_id)
        else:
            sets["passed"].add(test_id)
    return sets, seconds


def compare(runs: list[str]) -> int:
    """Print counts per run and the differences between runs; 1 if any set differs."""
    results: dict[str, dict[str, set[str]]] = {}
    out = sys.stdout.write
    out("== results (pytest's time; the run's wall time includes its stack and proxy)\n")
    for run in runs:
        name, junit, wall = run.split(":", 2)
        sets, seconds = outcomes(Path(junit))
        results[name] = sets
        counts = ", ".join(f"{len(ids)} {kind}" for kind, ids in sets.items())
        out(f"   {name:<10} {counts}; pytest {seconds:.0f} s, wall {float(wall):.0f} s\n")
    differ = False
    for (a, sets_a), (b, sets_b) in combinations(results.items(), 2):
        for kind in sets_a:
            only_a = sorted(sets_a[kind] - sets_b[kind])
            only_b = sorted(sets_b[kind] - sets_a[kind])
            if not only_a and not only_b:
                continue
            differ = True
            out(f"== {kind}: {len(only_a)} only in {a}, {len(only_b)} only in {b}\n")
            out("".join(f"   only {a}: {t}\n" for t in only_a))
            out("".join(f"   only {b}: {t}\n" for t in only_b))
    failed = sorted(set.intersection(*(sets["failed"] for sets in results.values())))
    if failed:
        out(f"== failed in every run ({len(failed)}):\n")
        out("".join(f"   {t}\n" for t in failed[:SHOW]))
        if len(failed) > SHOW:
            out(f"   ... and {len(failed) - SHOW} more (the JUnit files list them)\n")
    if differ:
        out("== the runs differ (see above)\n")
        return 1
    out(f"== no differences: the {len(results)} runs passed, failed and skipped the same tests\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    conf = commands.add_parser("proxy-conf")
    conf.add_argument("--state-dir", type=Path, required=True)
    conf.add_argument("--mode", choices=MODES, required=True)
    conf.add_argument("--port", type=int, required=True)
    conf.add_argument("--out", type=Path, required=True)
    conf.add_argument("--pipeline", choices=("stack", "saio"), default="stack")
    accounts = commands.add_parser("accounts")
    accounts.add_argument("--url", required=True)
    info = commands.add_parser("check-info")
    info.add_argument("--url", required=True)
    info.add_argument("--mode", choices=MODES, required=True)
    test = commands.add_parser("test-conf")
    test.add_argument("--url", required=True)
    test.add_argument("--out", type=Path, required=True)
    cmp = commands.add_parser("compare")
    cmp.add_argument("runs", nargs="+", metavar="NAME:JUNIT_XML:WALL_SECONDS")
    args = parser.parse_args()
    if args.command == "proxy-conf":
        args.out.write_text(proxy_conf(args.state_dir, args.mode, args.port, args.pipeline))
        return 0
    if args.command == "accounts":
        create_accounts(args.url)
        return 0
    if args.command == "check-info":
        sys.stdout.write(check_info(args.url, args.mode) + "\n")
        return 0
    if args.command == "test-conf":
        args.out.write_text(TEST_CONF.format(url=args.url.rstrip("/")))
        return 0
    return compare(args.runs)


if __name__ == "__main__":
    sys.exit(main())
