"""The one torch-free copy in ``hapi_cli.choices`` equals the value it stands for.

A failure here means the dataset sources' help changed: update ``hapi_cli/choices.py`` to match.
Every other value the parsers show is imported from its torch-free source module.
"""

from __future__ import annotations

from hapi_cli import choices
from hapi_client.datasets import SOURCE_SPEC_HELP


def test_source_spec_help_is_the_datasets_own() -> None:
    assert choices.SOURCE_SPEC_HELP == SOURCE_SPEC_HELP
