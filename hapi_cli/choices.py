"""The names and defaults the ``hapi`` parsers show, read without torch.

``hapi --help``, ``hapi CMD --help`` and usage errors build every parser, and most of the
libraries these values come from import torch when loaded: that costs seconds and hundreds of
MiB for a help text. So the values live in torch-free modules the parsers import
(``hapi_client.defaults``, ``hapi_bench.demo_config``, ``hapi_client.retry``; rule and attack
names in ``hapi_client.robust.names``), and the command handlers import the libraries. One copy
is left: the dataset sources' help, whose package loads its image decoders on import;
``tests/hapi_cli/test_cli_choices.py`` checks it against its source.
"""

from __future__ import annotations

import dataclasses

from hapi_bench.demo_config import DemoConfig

from hapi_client.defaults import DEFAULT_AUTH_URL, DEFAULT_ENDPOINT, MODES
from hapi_client.retry import DEFAULT_RETRY_BUDGET_S

__all__ = [
    "DEFAULT_AUTH_URL",
    "DEFAULT_ENDPOINT",
    "DEFAULT_RETRY_BUDGET_S",
    "DEMO_DEFAULTS",
    "MODES",
    "SOURCE_SPEC_HELP",
]

#: The ``hapi demo`` options' defaults.
DEMO_DEFAULTS: dict[str, float | int | None] = {
    name: value
    for name, value in dataclasses.asdict(DemoConfig()).items()
    if name
    in (
        "rate_mbit",
        "train_per_class",
        "test_per_class",
        "batch_size",
        "epochs",
        "freeze_index",
        "prefetch",
    )
}

#: ``hapi_client.datasets.SOURCE_SPEC_HELP``: the epilog of ``hapi upload dataset --help``.
SOURCE_SPEC_HELP = """\
A source spec is NAME[:ARG][?KEY=VALUE&KEY=VALUE...]:
  fashion-mnist:train|test          Debian's Fashion-MNIST, 28x28 PNG, 10 classes
                                    keys: limit, root (default /usr/share/datasets/fashion-mnist)
  digits[:all|train|test]           scikit-learn digits, 8x8 PNG, 10 classes (default all)
                                    keys: test_fraction (0.2), seed (0), limit
  folder:PATH                       an ImageFolder tree PATH/<class>/**/*.jpg|jpeg|png
                                    keys: shuffle (true), seed (0), limit
  photos[:train|test]               ImageNet-sized JPEG views of sklearn/skimage photos,
                                    10 classes (default train); keys: per_class (100),
                                    size (500x375), seed (0), quality (97),
                                    classes (comma list), workers
Examples: fashion-mnist:test?limit=500  digits:train?seed=1  folder:/data/pets?shuffle=false
          photos:train?per_class=200  photos:test?per_class=20&size=320x240
A PATH cannot contain '?' (everything after the first '?' is read as keys)."""
