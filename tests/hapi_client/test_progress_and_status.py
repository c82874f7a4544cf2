"""Say what is happening (issue 21, point 3), against the session's real stack.

A run logs one status line per step before its first batch (preflight, the model, the measured
costs with the bandwidth probe, the split, the first shard, the first batch), each with its time;
progress outside a terminal is one plain line every few percent, never a ``\\r`` redraw; a
``verify_fraction`` that draws no shard says so; the CLI's failure with Swift down is one line,
without urllib3's retry chatter.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hapi_models
import pytest

from hapi_client import FeatureDataset
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_client.progress import LINE_STEP_PERCENT, LineProgress, progress_bar

from .conftest import ClientEnv
from .test_preflight import _dead_port

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
#: Far below one shard in the few of the test container: no shard is drawn for verification.
NEVER = 1e-9


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


def _record(*names: str, level: int) -> Iterator[_Recorder]:
    """A handler on each named logger itself: ``hapi finetune`` (run in-process by other tests)
    stops the status logger's propagation to the root, where caplog listens."""
    recorder = _Recorder()
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.addHandler(recorder)
        logger.setLevel(level)
    try:
        yield recorder
    finally:
        for logger, old in saved:
            logger.removeHandler(recorder)
            logger.setLevel(old)


@pytest.fixture
def status_lines() -> Iterator[_Recorder]:
    yield from _record("hapi_client.status", level=logging.INFO)


@pytest.fixture
def warnings_logged() -> Iterator[_Recorder]:
    yield from _record("hapi_client.feature_dataset", "hapi_client.finetune", level=logging.INFO)


#: The steps before the first batch of a ``split="auto"`` run, in order, each with its time.
_STEPS = [
    ("preflight", r"^preflight ok in \d+\.\d\d s: "),
    ("model", r"^model client-models/efficientnet_lite0: [\d.]+ MB of weights .* in \d+\.\d\d s$"),
    ("bandwidth", r"^bandwidth probe: \d+ bytes of photos-train/\S+, \d+ timed in \d+\.\d\d s = "),
    ("client costs", r"^timings: the client's cost of layers \[0, \d+\) .* in \d+\.\d\d s$"),
    # The session's server may have timed this network for an earlier test: it then answers
    # from its kept timings (issue 31), and the line says which.
    (
        "server costs",
        r"^timings: the server's cost of layers \[0, \d+\) "
        r"(measured|answered from its kept timings) in \d+\.\d\d s$",
    ),
    ("split", r"^split \d+ \(freeze \d+\) decided in \d+\.\d\d s: "),
    ("first shard", r"^first shard requested \(\d+ shards, \d+ in flight\)$"),
    ("first delivery", r"^first shard delivered \(\d+ samples\)$"),
    ("first batch", r"^epoch 0: first batch \d+\.\d\d s after the epoch began$"),
]


def test_a_run_says_each_step_before_its_first_batch_and_what_verify_fraction_did(
    client_env: ClientEnv,
    status_lines: _Recorder,
    warnings_logged: _Recorder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with client_env.client() as client:
        result = client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=client_env.train,
            train=TrainOptions(batch_size=8, epochs=1, seed=0),
            extract=ExtractOptions(split="auto"),
            transform=SMALL,
            progress=True,  # to stderr, which pytest captures: not a terminal
            verify_fraction=NEVER,
        )
    lines = status_lines.messages(logging.INFO)
    found = []
    for step, pattern in _STEPS:
        at = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert at, f"no status line for {step} ({pattern}) in {lines}"
        found.append(at[0])
    assert found == sorted(found), f"steps out of order: {lines}"

    # Verification was asked for, drew nothing, and says so: in the counters, in a status line,
    # once per split at the start (the dataset) and once at the end (the recipe).
    assert result.extra["verified_samples"] == 0
    assert "verification: 0 samples of 0 shards matched the local computation" in lines
    warned = warnings_logged.messages(logging.WARNING)
    draws_none = [w for w in warned if "draws none of the" in w]
    assert len(draws_none) == 1 and f"verify_fraction={NEVER:g}" in draws_none[0]
    assert f"verify_fraction={NEVER:g} verified nothing in this run" in " | ".join(warned)

    # The progress of a run outside a terminal: plain lines, no redraw.
    err = capsys.readouterr().err
    assert "\r" not in err
    assert re.search(r"^hapi epoch 1/1: 100% \(\d+/\d+ it, ", err, re.MULTILINE), err


def test_a_fraction_that_draws_shards_counts_them_and_does_not_warn(
    client_env: ClientEnv, warnings_logged: _Recorder
) -> None:
    with client_env.client() as client:
        ds = FeatureDataset(
            client,
            model=client_env.models["efficientnet_lite0"].name,
            container=client_env.train,
            batch_size=8,
            split="freeze",
            transform=SMALL,
            verify_fraction=1.0,
            verify_samples=2,
            preflight=False,
        )
        batches = sum(1 for _ in ds)
    assert batches == len(ds)
    assert ds.last_counters.verified_samples == 2 * len(client.manifest(client_env.train).shards)
    assert not [w for w in warnings_logged.messages(logging.WARNING) if "verif" in w]


# -- progress outside a terminal -------------------------------------------------------------


def _percents(text: str, desc: str) -> list[int]:
    return [int(m) for m in re.findall(rf"^{re.escape(desc)}: (\d+)% \(", text, re.MULTILINE)]


@pytest.mark.parametrize(("total", "step"), [(200, 1), (60, 7), (1000, 3), (7, 1)])
def test_line_progress_writes_about_one_line_per_step_percent_and_no_carriage_return(
    total: int, step: int
) -> None:
    out = io.StringIO()
    bar = LineProgress(total, "train", out)
    done = 0
    while done < total:
        n = min(step, total - done)
        bar.update(n)
        done += n
        bar.set_postfix(sps=12)
    bar.close()
    bar.close()  # idempotent: no second final line
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    percents = _percents(text, "train")
    assert len(percents) == len(lines)  # every line is a progress line
    assert percents[-1] == 100 and lines[-1].startswith(f"train: 100% ({total}/{total} it, ")
    assert percents == sorted(set(percents))  # each percent once, in order
    # One line per 5 % step crossed (and the first update): at most 21 lines, however many
    # updates; fewer only when one update crosses several steps.
    assert len(lines) <= 100 // LINE_STEP_PERCENT + 1
    crossed = {p // LINE_STEP_PERCENT for p in percents}
    assert len(crossed) == len(percents)  # never two lines in the same 5 % step
    if total >= 100 and step <= total // 100:  # fine-grained updates: every step is shown
        assert len(lines) == 100 // LINE_STEP_PERCENT + 1
    assert "sps=12" in lines[-1]


def test_progress_bar_is_plain_lines_off_a_terminal_and_tqdm_on_one() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = io.StringIO()
    plain = progress_bar(40, "epoch", stream=log)
    for _ in range(40):
        plain.update()
    plain.close()
    assert isinstance(plain, LineProgress)
    assert "\r" not in log.getvalue() and len(log.getvalue().splitlines()) == 21

    term = Terminal()
    bar = progress_bar(40, "epoch", stream=term)
    for _ in range(40):
        bar.update()
    bar.close()
    assert not isinstance(bar, LineProgress) and "\r" in term.getvalue()  # tqdm redraws

    quiet = io.StringIO()
    off = progress_bar(40, "epoch", enabled=False, stream=quiet)
    off.update(40)
    off.close()
    assert quiet.getvalue() == ""


# -- the CLI with Swift down: one line, no urllib3 chatter ---------------------------------------

_HAPI = Path(sys.executable).parent / "hapi"


def test_the_cli_with_swift_down_prints_one_line_and_no_http_warnings() -> None:
    auth = f"http://127.0.0.1:{_dead_port()}/auth/v1.0"
    argv = [str(_HAPI), "finetune", "--model", "models/alexnet", "--container", "photos-train"]
    argv += ["--auth-url", auth, "--endpoint", f"http://127.0.0.1:{_dead_port()}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hapi: error: Swift: nothing listens at " + auth)
    assert "`hapi stack up`" in lines[0]
    for noise in ("urllib3", "WARNING", "Retrying", "Traceback"):
        assert noise not in done.stderr


# What the child runs: urllib3 retrying against a port where nothing listens, with warnings
# printed on stderr, before and after the client's quieting (a marker line in between).
_CHILD = """
import logging, sys
import urllib3
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
def attempt():
    pool = urllib3.PoolManager(retries=urllib3.Retry(total=2, backoff_factor=0))
    try:
        pool.request("GET", sys.argv[1])
    except urllib3.exceptions.MaxRetryError:
        pass
attempt()
print("--- quieted ---", file=sys.stderr, flush=True)
from hapi_client.progress import quiet_http_warnings
quiet_http_warnings()
attempt()
logging.getLogger("urllib3.connectionpool").setLevel(logging.DEBUG)
logging.getLogger().setLevel(logging.DEBUG)
print("--- debug ---", file=sys.stderr, flush=True)
attempt()
"""


def test_quieting_turns_urllib3_retry_warnings_into_debug_records() -> None:
    url = f"http://127.0.0.1:{_dead_port()}/"
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", _CHILD, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, _, rest = done.stderr.partition("--- quieted ---\n")
    quieted, _, debug = rest.partition("--- debug ---\n")
    # urllib3 does warn here, unquieted: the check below is not vacuous.
    assert "WARNING urllib3.connectionpool Retrying" in before
    assert quieted == ""
    # Still there for --debug, at debug level.
    assert "DEBUG urllib3.connectionpool Retrying" in debug
    assert "WARNING" not in debug


def test_the_evaluation_pass_says_it_is_one_and_decides_no_split(
    client_env: ClientEnv, status_lines: _Recorder
) -> None:
    # Issue 28, case 16: it logged "epoch 0: first batch" and "decided ...: forced by the caller".
    with client_env.client() as client:
        client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=client_env.train,
            eval_container=client_env.test,
            train=TrainOptions(batch_size=8, epochs=1, seed=0),
            extract=ExtractOptions(split="auto"),
            transform=SMALL,
            progress=False,
        )
    lines = status_lines.messages(logging.INFO)
    decided = [line for line in lines if re.search(r"^split \d+ \(freeze \d+\) decided", line)]
    assert len(decided) == 1 and "forced by the caller" not in decided[0], lines
    split = int(decided[0].split()[1])
    assert any(
        line.startswith(f"evaluation at split {split} (freeze ")
        and line.endswith("the training's split, not decided again")
        for line in lines
    ), lines
    firsts = [line for line in lines if "first batch" in line]
    assert len(firsts) == 2 and firsts[0].startswith("epoch 0: "), firsts
    assert firsts[1].startswith("evaluation pass 0: first batch"), firsts


def test_a_random_initialisation_is_named_at_upload_and_when_prepared(
    client_env: ClientEnv, status_lines: _Recorder
) -> None:
    # Issue 28, case 13: alexnet has no packaged weights; the fixture uploaded it without any.
    from hapi_client.preparation import prepare_model

    stored = client_env.models["alexnet"]
    assert stored.random_seed == 0
    assert client_env.models["efficientnet_lite0"].random_seed is None
    with client_env.client() as client:
        # By name: the descriptor read back from Swift carries the seed.
        prepare_model(client, stored.name, client_env.train, transform=SMALL)
        prepare_model(client, client_env.models["efficientnet_lite0"].name, client_env.train)
    warned = [line for line in status_lines.messages(logging.WARNING) if "random weights" in line]
    assert len(warned) == 1 and warned[0].startswith(f"model {stored.name}: random weights")
    assert "--weights torchvision" in warned[0]
