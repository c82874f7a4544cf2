"""A folder in torchvision's ImageFolder layout: ``root/<class>/**/<image>.{jpg,jpeg,png}``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hapi_contract.dataset import image_extension_of

from ._source import ImageSource, SourceSample
from .errors import SourceError

__all__ = ["FOLDER_IMAGE_SUFFIXES", "FolderSource"]

FOLDER_IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png")


def _raise_walk_error(exc: OSError) -> None:
    raise SourceError(f"cannot read folder {exc.filename}: {exc.strerror or exc}") from exc


class FolderSource(ImageSource):
    """Images from class subfolders, labelled by the sorted subfolder names (like ImageFolder).

    Class folders are the non-hidden subdirectories of ``root``; their images are found
    recursively (files ending in .jpg/.jpeg/.png, any case; other files are ignored). Files are
    stored as they are, without re-encoding; the format comes from the file's magic bytes.

    Args:
        root: the folder.
        shuffle: mix the classes in a seeded random order (default), so every shard holds all
            classes; otherwise class by class, files in sorted order.
        seed: seed of the shuffle.
        limit: keep only the first ``limit`` images (after shuffling).

    Raises:
        SourceError: missing or unreadable folder, no class folders, or a class without images.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        shuffle: bool = True,
        seed: int = 0,
        limit: int | None = None,
    ) -> None:
        root = Path(root).expanduser().absolute()
        if limit is not None and limit < 1:
            raise SourceError(f"limit must be >= 1, got {limit}")
        if not root.exists():
            raise SourceError(f"image folder {root} does not exist")
        if not root.is_dir():
            raise SourceError(f"image folder {root} is not a directory")
        try:
            classes = sorted(
                entry.name
                for entry in os.scandir(root)
                if entry.is_dir() and not entry.name.startswith(".")
            )
        except OSError as exc:
            raise SourceError(f"cannot read image folder {root}: {exc.strerror or exc}") from exc
        if not classes:
            raise SourceError(
                f"image folder {root} has no class subfolders (expected root/<class>/<image>.jpg)"
            )
        files: list[tuple[Path, int]] = []
        empty: list[str] = []
        for label, name in enumerate(classes):
            found = sorted(
                Path(directory) / filename
                for directory, _, filenames in os.walk(root / name, onerror=_raise_walk_error)
                for filename in filenames
                if filename.lower().endswith(FOLDER_IMAGE_SUFFIXES)
            )
            if not found:
                empty.append(name)
            files.extend((path, label) for path in found)
        if not files:
            raise SourceError(f"image folder {root} has no .jpg/.jpeg/.png images")
        if empty:
            raise SourceError(
                f"image folder {root}: class folder(s) without images: {', '.join(empty[:10])}"
            )
        if shuffle:
            order = np.random.default_rng(seed).permutation(len(files))
            files = [files[i] for i in order]
        if limit is not None:
            files = files[:limit]
        self._files = files
        params = [f"shuffle={'true' if shuffle else 'false'}"]
        if shuffle:
            params.append(f"seed={seed}")
        if limit is not None:
            params.append(f"limit={limit}")
        super().__init__(classes, f"folder:{root}?{'&'.join(params)}")

    def __len__(self) -> int:
        return len(self._files)

    def __iter__(self) -> Iterator[SourceSample]:
        for path, label in self._files:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise SourceError(f"cannot read image {path}: {exc.strerror or exc}") from exc
            ext = image_extension_of(data)
            if ext is None:
                raise SourceError(f"{path} is neither a JPEG nor a PNG file")
            yield SourceSample(data, ext, label)
