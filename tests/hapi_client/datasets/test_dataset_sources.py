"""The sample sources: counts, labels, decodable images, determinism and clear errors."""

from __future__ import annotations

import gzip
import io
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hapi_client.datasets import (
    DIGITS_CLASSES,
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    PHOTO_CLASSES,
    DigitsSource,
    FashionMNISTSource,
    FolderSource,
    PhotoSource,
    SourceError,
    SourceSample,
    load_photo,
)


def _decode(sample: SourceSample) -> Image.Image:
    image = Image.open(io.BytesIO(sample.image))
    image.load()
    assert image.format == {"png": "PNG", "jpg": "JPEG"}[sample.ext]
    return image


def _idx_labels(path: Path) -> np.ndarray:
    with gzip.open(path) as handle:
        data = handle.read()
    return np.frombuffer(data[8:], dtype=np.uint8)


# --- Fashion-MNIST ---------------------------------------------------------------------------


def test_fashion_mnist_counts_without_decoding_images() -> None:
    assert len(FashionMNISTSource("train")) == 60_000
    assert len(FashionMNISTSource("test")) == 10_000


def test_fashion_mnist_limited_samples_are_28x28_pngs_with_the_file_labels() -> None:
    source = FashionMNISTSource("test", limit=300)
    samples = list(source)
    assert len(samples) == len(source) == 300
    assert source.classes == FASHION_MNIST_CLASSES and len(source.classes) == 10
    expected = _idx_labels(FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")[:300]
    assert [s.label for s in samples] == expected.tolist()
    assert set(Counter(s.label for s in samples)) == set(range(10))
    for sample in samples[:20]:
        image = _decode(sample)
        assert (image.mode, image.size) == ("L", (28, 28))
    with gzip.open(FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz") as handle:
        first = np.frombuffer(handle.read(16 + 784)[16:], dtype=np.uint8).reshape(28, 28)
    assert np.array_equal(np.asarray(_decode(samples[0])), first)
    assert source.description == "fashion-mnist:test?limit=300"


def test_fashion_mnist_is_deterministic() -> None:
    assert list(FashionMNISTSource("train", limit=5)) == list(FashionMNISTSource("train", limit=5))


def test_fashion_mnist_missing_files(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="dataset-fashion-mnist"):
        FashionMNISTSource("train", root=tmp_path)


def test_fashion_mnist_corrupt_files(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as handle:
        handle.write(b"\0\0\x08\x03" + b"\0" * 12)  # 3 dimensions where labels have 1
    with pytest.raises(SourceError, match="not an idx file"):
        FashionMNISTSource("train", root=tmp_path)


def test_fashion_mnist_truncated_images(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as handle:
        handle.write(b"\0\0\x08\x01" + (2).to_bytes(4, "big") + b"\x01\x02")
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as handle:
        header = b"\0\0\x08\x03" + b"".join(n.to_bytes(4, "big") for n in (2, 28, 28))
        handle.write(header + b"\0" * 784)  # one image where the header promises two
    source = FashionMNISTSource("train", root=tmp_path)
    with pytest.raises(SourceError, match="truncated idx data"):
        list(source)


def test_fashion_mnist_bad_arguments() -> None:
    with pytest.raises(SourceError, match="split"):
        FashionMNISTSource("validation")  # type: ignore[arg-type]
    with pytest.raises(SourceError, match="limit"):
        FashionMNISTSource("train", limit=0)


# --- digits ------------------------------------------------------------------------------------


def test_digits_all_matches_sklearn() -> None:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    source = DigitsSource()
    samples = list(source)
    assert len(samples) == len(source) == 1797
    assert source.classes == DIGITS_CLASSES
    assert [s.label for s in samples] == bunch.target.tolist()
    image = _decode(samples[5])
    assert (image.mode, image.size) == ("L", (8, 8))
    expected = np.rint(bunch.images[5] * 255 / 16).astype(np.uint8)
    assert np.array_equal(np.asarray(image), expected)


def test_digits_split_is_seeded_and_disjoint() -> None:
    train, test = DigitsSource("train"), DigitsSource("test")
    assert (len(train), len(test)) == (1797 - 359, 359)
    # Identify images by (bytes, label): the two splits together are exactly the whole set.
    every = Counter((s.image, s.label) for s in DigitsSource())
    assert Counter((s.image, s.label) for s in [*train, *test]) == every
    assert list(DigitsSource("test")) == list(test)
    assert [s.label for s in DigitsSource("test", seed=1)] != [s.label for s in test]
    assert len(DigitsSource("test", test_fraction=0.5)) == round(0.5 * 1797)
    assert len(DigitsSource("train", limit=10)) == 10


def test_digits_bad_arguments() -> None:
    with pytest.raises(SourceError, match="test_fraction"):
        DigitsSource("train", test_fraction=1.0)
    with pytest.raises(SourceError, match="split"):
        DigitsSource("val")  # type: ignore[arg-type]


# --- ImageFolder layout --------------------------------------------------------------------------


def _save(path: Path, fmt: str, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (6, 5), (value, value, value)).save(path, format=fmt)


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """Three classes; the grey level of each image encodes its class (10, 20, 30)."""
    root = tmp_path / "pets"
    _save(root / "cat" / "a.jpg", "JPEG", 10)
    _save(root / "cat" / "B.PNG", "PNG", 10)
    _save(root / "cat" / "nested" / "c.jpeg", "JPEG", 10)
    _save(root / "dog" / "x.png", "PNG", 20)
    _save(root / "emu" / "y.jpg", "JPEG", 30)
    _save(root / "emu" / "z.jpg", "PNG", 30)  # misnamed: stored as what it really is
    (root / "emu" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    _save(root / ".hidden" / "h.png", "PNG", 99)
    (root / "README").write_text("top-level files are ignored")
    return root


def test_folder_classes_labels_and_formats(image_tree: Path) -> None:
    source = FolderSource(image_tree, shuffle=False)
    assert source.classes == ("cat", "dog", "emu")
    samples = list(source)
    assert len(samples) == len(source) == 6
    assert [s.label for s in samples] == [0, 0, 0, 1, 2, 2]
    assert [s.ext for s in samples] == ["png", "jpg", "jpg", "png", "jpg", "png"]
    for sample in samples:
        grey = np.asarray(_decode(sample).convert("L"), dtype=float).mean()
        assert abs(grey - 10 * (sample.label + 1)) < 3
    assert samples[0].image == (image_tree / "cat" / "B.PNG").read_bytes()  # stored as is


def test_folder_shuffle_is_seeded(image_tree: Path) -> None:
    ordered = list(FolderSource(image_tree, shuffle=False))
    shuffled = list(FolderSource(image_tree, seed=3))
    assert shuffled == list(FolderSource(image_tree, seed=3))
    assert sorted(shuffled) == sorted(ordered)
    orders = {tuple(s.image for s in FolderSource(image_tree, seed=seed)) for seed in range(6)}
    assert len(orders) > 1
    assert len(FolderSource(image_tree, limit=2)) == 2


def test_folder_missing(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        FolderSource(tmp_path / "nope")


def test_folder_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SourceError, match="not a directory"):
        FolderSource(tmp_path / "file")


def test_folder_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root ignores file modes, so a permission error is simulated at the one call that lists.
    def denied(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(SourceError, match="cannot read image folder .*Permission denied"):
        FolderSource(tmp_path)


def test_folder_without_classes(tmp_path: Path) -> None:
    _save(tmp_path / "loose.png", "PNG", 1)
    with pytest.raises(SourceError, match="no class subfolders"):
        FolderSource(tmp_path)


def test_folder_without_images(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match="no .jpg/.jpeg/.png images"):
        FolderSource(tmp_path)


def test_folder_with_an_empty_class(image_tree: Path) -> None:
    (image_tree / "fox").mkdir()
    with pytest.raises(SourceError, match="without images: fox"):
        FolderSource(image_tree)


def test_folder_file_that_is_not_an_image(image_tree: Path) -> None:
    (image_tree / "dog" / "fake.jpg").write_bytes(b"GIF89a not really")
    with pytest.raises(SourceError, match="fake.jpg is neither a JPEG nor a PNG"):
        list(FolderSource(image_tree))


def test_folder_file_vanished_after_listing(image_tree: Path) -> None:
    source = FolderSource(image_tree, shuffle=False)
    (image_tree / "dog" / "x.png").unlink()
    with pytest.raises(SourceError, match="cannot read image .*x.png"):
        list(source)


# --- photos ------------------------------------------------------------------------------------


def test_every_photo_loads_offline() -> None:
    for name in PHOTO_CLASSES:
        pixels = load_photo(name)
        assert pixels.ndim == 3 and pixels.shape[2] == 3 and min(pixels.shape[:2]) >= 300
        assert not pixels.flags.writeable


def test_photos_small_run_shapes_labels_and_determinism() -> None:
    source = PhotoSource("train", per_class=2)
    samples = list(source)
    assert len(samples) == len(source) == 20
    assert source.classes == PHOTO_CLASSES
    assert [s.label for s in samples] == [i % 10 for i in range(20)]
    for sample in samples:
        image = _decode(sample)
        assert (image.mode, image.size, sample.ext) == ("RGB", (500, 375), "jpg")
    assert samples == list(PhotoSource("train", per_class=2))
    assert len({s.image for s in samples}) == 20
    test_images = {s.image for s in PhotoSource("test", per_class=2)}
    assert not test_images & {s.image for s in samples}
    assert {s.image for s in PhotoSource("train", per_class=2, seed=1)} != {
        s.image for s in samples
    }


def test_photos_views_resemble_their_photo() -> None:
    # A view's mean colour is nearest to its own photo's: the label is about the content.
    source = PhotoSource(
        "train", per_class=3, size=(100, 75), classes=["retina", "hubble_deep_field"]
    )
    for sample in source:
        view = np.asarray(_decode(sample), dtype=float).mean(axis=(0, 1))
        others = [load_photo(c).mean(axis=(0, 1)) for c in source.classes]
        assert np.argmin([np.abs(view - o).sum() for o in others]) == sample.label


def test_photos_workers_do_not_change_the_output() -> None:
    single = list(PhotoSource("test", per_class=3, size=(64, 48), workers=1))
    pooled = list(PhotoSource("test", per_class=3, size=(64, 48), workers=2))
    assert pooled == single


def test_photos_size_quality_and_subset() -> None:
    source = PhotoSource(
        "train", per_class=1, size=(64, 32), quality=50, classes=["rocket", "china"]
    )
    assert source.classes == ("rocket", "china")
    assert [_decode(s).size for s in source] == [(64, 32), (64, 32)]
    assert source.description == (
        "photos:train?per_class=1&size=64x32&seed=0&quality=50&classes=rocket,china"
    )


def test_photos_mean_stored_size_is_imagenet_like() -> None:
    """100 views at the defaults; the mean JPEG size is printed for the report."""
    sizes = [len(s.image) for s in PhotoSource("train", per_class=10)]
    mean = float(np.mean(sizes))
    print(f"photos: mean {mean / 1000:.1f} kB over {len(sizes)} images "
          f"(min {min(sizes) / 1000:.1f}, max {max(sizes) / 1000:.1f})")  # fmt: skip
    assert 90_000 < mean < 130_000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"split": "val"}, "split"),
        ({"per_class": 0}, "per_class"),
        ({"size": (8, 8)}, "size"),
        ({"quality": 101}, "quality"),
        ({"classes": ["lena"]}, "photo classes"),
        ({"classes": ["china", "china"]}, "photo classes"),
        ({"classes": []}, "photo classes"),
        ({"workers": 0}, "workers"),
    ],
)
def test_photos_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(SourceError, match=match):
        PhotoSource(**kwargs)  # type: ignore[arg-type]


def test_load_photo_unknown() -> None:
    with pytest.raises(SourceError, match="unknown photo"):
        load_photo("lena")
