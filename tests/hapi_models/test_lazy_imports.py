"""Importing the packages stays cheap: torchvision loads only when a model is built or images decoded."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["hapi_models", "hapi_client", "hapi_contract"])
def test_import_does_not_load_torchvision(package: str) -> None:
    code = (
        f"import sys, {package}; "
        "import hapi_models; hapi_models.get_spec('alexnet'); hapi_models.thesis_models(); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_listing_every_architecture_loads_it() -> None:
    # The listing includes torchvision's networks: discovering them is what imports it.
    code = "import sys, hapi_models; hapi_models.list_models(); print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_building_a_model_loads_it() -> None:
    code = (
        "import sys, hapi_models; hapi_models.get_model('alexnet', num_classes=2); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
