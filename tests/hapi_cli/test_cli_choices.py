"""The torch-free copies in ``hapi_cli.choices`` equal the values of the libraries they stand for.

A failure here means a library changed (a new architecture, mode or default): update
``hapi_cli/choices.py`` to match. Rule and attack names are not copied: the CLI reads them from
``hapi_client.robust.names`` (see ``tests/hapi_client/robust/test_robust_names.py``).
"""

from __future__ import annotations

import dataclasses

from hapi_bench.demo import DemoConfig

import hapi_client
from hapi_cli import choices
from hapi_client.datasets import SOURCE_SPEC_HELP


def test_modes_are_the_client_s() -> None:
    assert choices.MODES == hapi_client.MODES


def test_defaults_are_the_client_s() -> None:
    assert choices.DEFAULT_ENDPOINT == hapi_client.DEFAULT_ENDPOINT
    assert choices.DEFAULT_AUTH_URL == hapi_client.DEFAULT_AUTH_URL


def test_demo_defaults_are_demo_config_s() -> None:
    config = dataclasses.asdict(DemoConfig())
    assert choices.DEMO_DEFAULTS == {name: config[name] for name in choices.DEMO_DEFAULTS}


def test_source_spec_help_is_the_datasets_own() -> None:
    assert choices.SOURCE_SPEC_HELP == SOURCE_SPEC_HELP
