"""A rule or an attack is named once, at its class statement, and the CLI reads that without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hapi_cli.main import main
from hapi_client.robust import (
    Aggregator,
    Attack,
    PreAggregator,
    aggregator_class,
    list_aggregators,
    list_attacks,
    list_preaggregators,
)
from hapi_client.robust.names import AGGREGATORS, ATTACKS, PREAGGREGATORS


def test_the_names_read_from_the_sources_are_the_registered_ones() -> None:
    assert AGGREGATORS.names() == list_aggregators()
    assert PREAGGREGATORS.names() == list_preaggregators()
    assert ATTACKS.names() == list_attacks()


@pytest.mark.parametrize(
    ("kind", "base"),
    [(AGGREGATORS, Aggregator), (PREAGGREGATORS, PreAggregator), (ATTACKS, Attack)],
)
def test_every_registered_class_carries_its_name(kind: object, base: type) -> None:
    table = kind.load()  # type: ignore[attr-defined]
    assert table
    for name, cls in table.items():
        assert issubclass(cls, base) and cls.name == name


def test_aliases_are_declared_at_the_class() -> None:
    assert aggregator_class("trmean") is aggregator_class("trimmed_mean")
    assert "mean" in aggregator_class("average").aliases


def test_a_taken_name_is_refused_at_the_class_statement() -> None:
    with pytest.raises(ValueError, match="'krum' is taken by Krum"):

        class _Copy(Aggregator, name="krum"):
            def _aggregate(self, data):  # type: ignore[no-untyped-def]
                return data[0]

    with pytest.raises(ValueError, match="must be written 'my_rule'"):

        class _Badly(Aggregator, name="My-Rule"):
            def _aggregate(self, data):  # type: ignore[no-untyped-def]
                return data[0]

    assert "my_rule" not in list_aggregators()


def test_the_finetune_help_lists_every_rule_and_attack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["finetune", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(list_aggregators()) in text
    assert ", ".join(list_attacks()) in text


def test_the_names_and_the_client_package_load_no_torch() -> None:
    child = (
        "import json, sys\n"
        "import hapi_client\n"
        "from hapi_client.robust.names import AGGREGATORS, ATTACKS\n"
        "names = AGGREGATORS.names() + ATTACKS.names()\n"
        "print(json.dumps([len(names), sorted(m for m in ('torch', 'torchvision') if m in sys.modules)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=120
    )
    count, heavy = json.loads(out.stdout)
    assert count == len(list_aggregators()) + len(list_attacks())
    assert heavy == []
