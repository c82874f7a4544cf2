"""The torch-free copies in ``hapi_cli.choices`` equal the values of the libraries they stand for.

A failure here means a library changed (a new architecture, aggregator, attack, mode or default):
update ``hapi_cli/choices.py`` to match.
"""

from __future__ import annotations

import dataclasses

import hapi_models
from hapi_bench.demo import DemoConfig

import hapi_client
from hapi_cli import choices
from hapi_client.datasets import SOURCE_SPEC_HELP
from hapi_client.robust import list_aggregators, list_attacks


def test_architectures_are_the_registry() -> None:
    assert list(choices.ARCHITECTURES) == hapi_models.list_models()


def test_modes_aggregators_and_attacks_are_the_client_s() -> None:
    assert choices.MODES == hapi_client.MODES
    assert list(choices.AGGREGATORS) == list_aggregators()
    assert list(choices.ATTACKS) == list_attacks()


def test_defaults_are_the_client_s() -> None:
    assert choices.DEFAULT_ENDPOINT == hapi_client.DEFAULT_ENDPOINT
    assert choices.DEFAULT_AUTH_URL == hapi_client.DEFAULT_AUTH_URL
    assert choices.DEFAULT_RETRY_BUDGET_S == hapi_client.DEFAULT_RETRY_BUDGET_S


def test_demo_defaults_are_demo_config_s() -> None:
    config = dataclasses.asdict(DemoConfig())
    assert choices.DEMO_DEFAULTS == {name: config[name] for name in choices.DEMO_DEFAULTS}


def test_source_spec_help_is_the_datasets_own() -> None:
    assert choices.SOURCE_SPEC_HELP == SOURCE_SPEC_HELP
