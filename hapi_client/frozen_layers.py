"""How this process runs the frozen layers it computes itself, and times them for a plan.

BASELINE runs every frozen layer here, HAPI those between the split and the freeze index; both
run them as a HAPI server runs its heads (issue 30): their batch norms folded into the
convolutions before them (:class:`hapi_models.BatchNormFolder`) and in the layout that measured
faster on this device (``channels_last`` or not, and the samples per forward:
:class:`hapi_models.LayoutChooser`). The plan's client costs time the layers through the same
folds and layouts (``hapi_client.planning.costs``): timed contiguous and unfolded, they cost
several times what they cost when run, and the split rule moved layers to the server for it.
"""

from __future__ import annotations

import hapi_models
import torch
from torch import nn

__all__ = ["FOLDER", "LAYOUTS", "run_frozen"]

#: This process's layout choices for the frozen layers it runs, as a HAPI server keeps its own
#: for the heads it runs: BASELINE's frozen layers are the same computation as HAPI's head and
#: must not be slower here. Kept in the process and on disk, not in the LocalModel, which
#: stays a plain nn.Module that copies and pickles.
LAYOUTS = hapi_models.LayoutChooser(persist=True)
#: The frozen layers' folds, made once per module and kept while it lives (the plan's timing folds
#: copies of its own: it also times layers a split leaves to the server).
FOLDER = hapi_models.BatchNormFolder()


def run_frozen(
    arch: str, split: int, freeze: int, layers: nn.ModuleList, x: torch.Tensor
) -> torch.Tensor:
    """Layers ``[split, freeze)`` over ``x``, folded and in this device's faster layout; the
    trainable layers after them get a contiguous input, so that their training runs the
    kernels it always ran."""
    head = FOLDER.layers(layers, x)
    key = ("client-frozen", arch, split, freeze, tuple(x.shape[1:]), str(x.device))
    return LAYOUTS.forward(key, head, x).contiguous()
