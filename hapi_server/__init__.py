"""The HAPI server: split feature extraction next to OpenStack Swift, with batch adaptation.

The extraction itself, its errors and its memory planner are :mod:`hapi_core`'s; this package
is the HTTP front (FastAPI routes, the ``HAPI_*`` settings, reading Swift as the caller) and the
ALL_IN_COS fine-tuning.
"""

from .app import create_app
from .settings import ServerSettings, get_settings

__all__ = ["ServerSettings", "create_app", "get_settings"]
