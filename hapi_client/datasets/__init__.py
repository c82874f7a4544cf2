"""Datasets in Swift, client side: sample sources, sharding and idempotent upload.

Sources yield labelled encoded images (:class:`SourceSample`) with class names::

    source = get_source("photos:train?per_class=100")   # or fashion-mnist:train, digits, folder:/p
    manifest = upload_dataset(conn, source, "photos-train")
    manifest = load_manifest(conn, "photos-train")

Data already in Swift is indexed in place instead (nothing is copied or rewritten)::

    manifest = index_dataset(conn, "imagenet", prefix="train/", layout="folder",
                             into="imagenet-train")

The shard and manifest format itself is ``hapi_contract.dataset`` (the in-place layouts:
``hapi_contract.layouts``); the spec syntax is in ``SOURCE_SPEC_HELP``.
"""

from . import (
    _digits,
    _fashion_mnist,
    _folder,
    _index,
    _index_state,
    _listing,
    _photos,
    _registry,
    _sharding,
    _source,
    _swift,
    _upload,
    errors,
)
from ._digits import *  # noqa: F403
from ._fashion_mnist import *  # noqa: F403
from ._folder import *  # noqa: F403
from ._index import *  # noqa: F403
from ._index_state import *  # noqa: F403
from ._listing import *  # noqa: F403
from ._photos import *  # noqa: F403
from ._registry import *  # noqa: F403
from ._sharding import *  # noqa: F403
from ._source import *  # noqa: F403
from ._swift import *  # noqa: F403
from ._upload import *  # noqa: F403
from .errors import *  # noqa: F403

__all__ = [
    *_digits.__all__,
    *_fashion_mnist.__all__,
    *_folder.__all__,
    *_index.__all__,
    *_index_state.__all__,
    *_listing.__all__,
    *_photos.__all__,
    *_registry.__all__,
    *_sharding.__all__,
    *_source.__all__,
    *_swift.__all__,
    *_upload.__all__,
    *errors.__all__,
]
