"""docs/models.md's split-point counts are what ``hapi models NAME`` prints (issue 28, case 16:
the page said ConvNeXt-T had 37 where the command said 38 split points)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hapi_cli.main import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
ARCH = {
    "ViT-B/16": "vit_b_16",
    "ConvNeXt-T": "convnext_tiny",
    "Swin-T": "swin_t",
    "MobileNetV3-S": "mobilenet_v3_small",
}


def _documented() -> dict[str, tuple[int, int]]:
    """``{arch: (layers, split points)}`` from the page's sentence."""
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    sentence = re.search(r"ViT-B/16 has (\d+) layers, so (\d+) split points.*?counts them\.", text)
    assert sentence is not None, "docs/models.md no longer gives the split-point counts"
    counts = {"vit_b_16": (int(sentence.group(1)), int(sentence.group(2)))}
    for name, layers, points in re.findall(r"([\w/-]+) (\d+) \((\d+)\)", sentence.group(0)):
        counts[ARCH[name]] = (int(layers), int(points))
    assert set(counts) == set(ARCH.values())
    return counts


@pytest.mark.parametrize("arch", sorted(ARCH.values()))
def test_the_documented_counts_are_the_commands(
    arch: str, capsys: pytest.CaptureFixture[str]
) -> None:
    layers, points = _documented()[arch]
    assert points == layers + 1  # split 0 is the input itself
    assert main(["models", arch]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f": {points} split points," in header, header
