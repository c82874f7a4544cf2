"""The HAPI wire contract: paths and headers, request and response schemas, the dataset format.

The server, the client and the Swift proxy filter import this package and nothing of each
other. Its top level needs the standard library and pydantic only; the two parts that compute
with tensors are submodules, imported explicitly by who needs them. Neither imports torch at
import time (only the functions that make or read a tensor do), so no part of the contract
loads torch by being imported:

* :mod:`hapi_contract.frames`: the framed tensor stream codec (the layout: ``docs/frames.md``);
* :mod:`hapi_contract.epochs`: the order in which an epoch visits samples.

:mod:`hapi_contract.layouts` specifies the datasets indexed in place (``folder``, ``webdataset``).
"""

from . import (
    dataset,
    errors,
    http,
    layouts,
    profile,
    requests,
    responses,
    shard_reading,
    timings,
)
from .dataset import *  # noqa: F403
from .errors import *  # noqa: F403
from .http import *  # noqa: F403
from .layouts import *  # noqa: F403
from .profile import *  # noqa: F403
from .requests import *  # noqa: F403
from .responses import *  # noqa: F403
from .shard_reading import *  # noqa: F403
from .timings import *  # noqa: F403

# dict.fromkeys: layouts re-exports DatasetLayout beside the layouts it describes.
__all__ = list(
    dict.fromkeys(
        [
            *dataset.__all__,
            *errors.__all__,
            *http.__all__,
            *layouts.__all__,
            *profile.__all__,
            *requests.__all__,
            *responses.__all__,
            *shard_reading.__all__,
            *timings.__all__,
        ]
    )
)
