"""Model formats edgekit knows, and how a file's format is recognised."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from .errors import ModelLoadError


class Format(str, Enum):
    TORCH = "torch"  # a torch.export program (.pt2) or an in-memory nn.Module
    ONNX = "onnx"
    TFLITE = "tflite"
    COREML = "coreml"


SUFFIXES = {
    ".pt2": Format.TORCH,
    ".onnx": Format.ONNX,
    ".tflite": Format.TFLITE,
    ".mlpackage": Format.COREML,
    ".mlmodel": Format.COREML,
}

# Which runtime on the device runs which format.
RUNTIME_FOR_FORMAT = {
    Format.ONNX: "onnxruntime",
    Format.TFLITE: "litert",
    Format.COREML: "coreml",
}


def detect_format(path: str | Path) -> Format:
    p = Path(path)
    fmt = SUFFIXES.get(p.suffix.lower())
    if fmt is None:
        if p.suffix.lower() in (".pt", ".pth", ".bin", ".ckpt"):
            raise ModelLoadError(
                f"{p.name}: a pickled PyTorch checkpoint needs its architecture",
                hint="pass --arch module:Class (loaded with torch.load(weights_only=True)), "
                "or save the model with torch.export.save(torch.export.export(model, example), 'model.pt2')",
            )
        raise ModelLoadError(
            f"{p.name}: unknown model format '{p.suffix or '(no suffix)'}'",
            hint="edgekit takes a torch.export program (.pt2), an ONNX file (.onnx), a .tflite, "
            "or a pickled state dict (.pt/.pth) with --arch module:Class",
        )
    return fmt
