"""Run a module with timm and torchvision importable, for Gemma 3n's multimodal class on these CPU
machines (its vision tower is a timm model, and timm imports torchvision).

PyPI's torchvision wheel is built against CUDA libtorch: beside this project's CPU torch its C ops
cannot load, and its `_meta_registrations` then fails on import, registering fake kernels for
`torchvision::nms` and `torchvision::qnms`, ops that only the C library defines. Installed into
.venv it would break every `import transformers` that probes for it, so scripts/setup.sh puts it
(with timm) in .cache/vision-libs instead, and this launcher, used only by the Gemma 3n multimodal
test, adds that folder to the path and defines the two ops' schemas where the C library did not.
No kernel is faked: calling either op still fails, and neither Gemma 3n nor the checks call them.
A GPU image with a matching torchvision needs none of this (`pip install timm`).

Usage: python -m tests.vision_libs MODULE_OR_SCRIPT.py [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VISION_LIBS = Path(os.environ.get("TIDE_VISION_LIBS", REPO / ".cache" / "vision-libs"))
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def missing() -> str:
    """Why the vision libraries cannot be used here ('' when they can)."""
    if not (VISION_LIBS / "timm").is_dir() or not (VISION_LIBS / "torchvision").is_dir():
        return f"timm and torchvision are not in {VISION_LIBS}: run `bash scripts/setup.sh`"
    return ""


def enable() -> None:
    import torch

    if missing():
        raise RuntimeError(missing())
    sys.path.insert(0, str(VISION_LIBS))
    extension = next((VISION_LIBS / "torchvision").glob("_C*.so"), None)
    try:
        if extension is None:
            raise OSError("no torchvision/_C library")
        torch.ops.load_library(str(extension))
    except OSError:
        library = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            library.define(schema)
        enable.library = library  # a Library drops its definitions when collected


def main(argv: list[str]) -> None:
    enable()
    sys.argv = list(argv)
    if argv[0].endswith(".py"):
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))  # as `python SCRIPT` would
        runpy.run_path(argv[0], run_name="__main__")
    else:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
