"""The names and defaults the ``hapi`` parsers show, held here so that parsing needs no torch.

``hapi --help``, ``hapi CMD --help`` and usage errors build every parser, and the libraries these
values come from import torch when loaded (``hapi_models``, ``hapi_client``'s training modules,
``hapi_bench.demo``): that costs seconds and hundreds of MiB for a help text. So the parsers read
the copies below and the command handlers import the libraries.
``tests/hapi_cli/test_cli_choices.py`` checks every copy against its source. What can be read
without torch is not copied: rule and attack names come from ``hapi_client.robust.names``, the
retry budget from ``hapi_client.retry``.
"""

from __future__ import annotations

from hapi_client.retry import DEFAULT_RETRY_BUDGET_S

__all__ = [
    "DEFAULT_AUTH_URL",
    "DEFAULT_ENDPOINT",
    "DEFAULT_RETRY_BUDGET_S",
    "DEMO_DEFAULTS",
    "MODES",
    "SOURCE_SPEC_HELP",
]

#: ``hapi_client.MODES``: the fine-tuning modes.
MODES: tuple[str, ...] = ("hapi", "baseline", "all_in_cos")

#: ``hapi_client.DEFAULT_ENDPOINT``: where the HAPI server listens by default.
DEFAULT_ENDPOINT = "http://127.0.0.1:8090"

#: ``hapi_client.DEFAULT_AUTH_URL``: the local Swift's tempauth URL.
DEFAULT_AUTH_URL = "http://127.0.0.1:8080/auth/v1.0"


#: The ``hapi demo`` options' defaults: fields of ``hapi_bench.DemoConfig()``.
DEMO_DEFAULTS: dict[str, float | int | None] = {
    "rate_mbit": None,
    "train_per_class": 30,
    "test_per_class": 10,
    "batch_size": 50,
    "epochs": 1,
    "freeze_index": 13,
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
