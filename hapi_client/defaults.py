"""Where the local stack listens and which modes a run may take: read without torch.

The ``hapi`` parsers show these in their help and choices; importing this module loads nothing
else, so ``hapi --help`` stays free of torch while reading the library's own values.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["DEFAULT_AUTH_URL", "DEFAULT_ENDPOINT", "MODES", "Mode"]

#: The local Swift's tempauth URL (``hapi stack up``).
DEFAULT_AUTH_URL = "http://127.0.0.1:8080/auth/v1.0"
#: Where the HAPI server listens by default.
DEFAULT_ENDPOINT = "http://127.0.0.1:8090"

Mode = Literal["hapi", "baseline", "all_in_cos"]
#: The fine-tuning modes: pushdown, raw shards decoded here, or training on the server too.
MODES: tuple[str, ...] = ("hapi", "baseline", "all_in_cos")
