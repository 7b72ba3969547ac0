"""The model handle that flows through the pipeline.

An Artifact is immutable: converters and passes take one and return a new one whose lineage
has one more step. Its ``sha256`` is of the file's bytes (of every file, for a format whose model is
a set of files: ``files``), so two artifacts with the same hash are the same model wherever they came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .formats import Format, model_files
from .fsutil import sha256_file, sha256_files


class TensorSpec(BaseModel):
    """One model input or output. ``shape`` uses None for a dynamic dimension."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    shape: tuple[int | None, ...]
    dtype: str  # numpy dtype name, e.g. "float32", "int8"
    layout: str | None = None  # e.g. "NCHW"; None when not an image tensor
    # When the runtime's tensor has another layout than the user's data (e.g. an NHWC TFLite graph
    # fed NCHW data), the permutation that the agent applies to user data before feeding it.
    transpose: tuple[int, ...] | None = None
    # Quantization parameters of an integer I/O tensor: real = (q - zero_point) * scale.
    scale: float | None = None
    zero_point: int | None = None


class IOSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


class LineageStep(BaseModel):
    """One step that produced an artifact: an import, a conversion hop or a pass."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["source", "convert", "pass"]
    name: str  # e.g. "torch->onnx", "quantize"
    config: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    input_sha256: str | None = None
    seconds: float | None = None


class Artifact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Format
    path: Path
    sha256: str
    io: IOSpec
    lineage: tuple[LineageStep, ...] = ()
    precision: str = "fp32"  # fp32 | fp16 | int8 | mixed

    @classmethod
    def from_file(cls, path: str | Path, fmt: Format, io: IOSpec, *, lineage=(), precision="fp32") -> "Artifact":
        p = Path(path).resolve()
        files = model_files(p, fmt)
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise FileNotFoundError(f"{p.name}: the model's file(s) {missing} are missing beside it")
        return cls(format=fmt, path=p, sha256=sha256_files(files) if len(files) > 1 else sha256_file(p), io=io,
                   lineage=tuple(lineage), precision=precision)

    def derive(self, path: str | Path, *, fmt: Format | None = None, io: IOSpec | None = None,
               step: LineageStep, precision: str | None = None) -> "Artifact":
        """A new artifact produced from this one by ``step``."""
        step = step.model_copy(update={"input_sha256": self.sha256})
        return Artifact.from_file(
            path,
            fmt or self.format,
            io or self.io,
            lineage=(*self.lineage, step),
            precision=precision or self.precision,
        )

    @property
    def files(self) -> list[Path]:
        """The files this model is made of: ``path`` first, then its format's companions (same stem)."""
        return model_files(self.path, self.format)

    @property
    def runtime_options(self) -> dict[str, Any]:
        """Runtime options the file needs to run as it was made (NCNN's fp16 setting: a run-time option,
        not a property of the .param/.bin), pinned by its last conversion (``config.runtime_options``)."""
        step = next((s for s in reversed(self.lineage) if s.kind == "convert"), None)
        return dict(step.config.get("runtime_options") or {}) if step is not None else {}

    @property
    def fixed_shapes(self) -> dict[str, tuple[list[int], str]]:
        """Input name -> (static shape, "user" | "data") from the last hop that fixed a dynamic model's sizes."""
        for step in reversed(self.lineage):
            shapes = step.config.get("input_shapes") if step.kind == "convert" else None
            if shapes:
                return {k: (list(v), step.config.get("input_shapes_from", "user")) for k, v in shapes.items()}
        return {}

    @property
    def size_bytes(self) -> int:
        p = self.path
        if p.is_dir():  # .mlpackage
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return sum(f.stat().st_size for f in self.files)

    def lineage_dicts(self) -> list[dict[str, Any]]:
        return [s.model_dump(mode="json") for s in self.lineage]
