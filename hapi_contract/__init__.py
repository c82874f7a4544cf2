"""The HAPI wire contract: request schemas, the framed tensor stream and the dataset format.

The server and the client import this package and nothing of each other. It depends on
pydantic, numpy, torch and zstandard only (no FastAPI, no httpx).
"""

from . import dataset, epochs, errors, frames, profile, requests
from .dataset import *  # noqa: F403
from .epochs import *  # noqa: F403
from .errors import *  # noqa: F403
from .frames import *  # noqa: F403
from .profile import *  # noqa: F403
from .requests import *  # noqa: F403

__all__ = [
    *dataset.__all__,
    *epochs.__all__,
    *errors.__all__,
    *frames.__all__,
    *profile.__all__,
    *requests.__all__,
]
