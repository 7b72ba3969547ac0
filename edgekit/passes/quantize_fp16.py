"""fp16 ONNX: weights and activations in half precision (onnxruntime's own ``float16`` converter,
shipped in the ``onnxruntime`` wheel as ``onnxruntime.transformers.float16``; onnxconverter-common's
converter is the same code), inputs and outputs kept in float32 (``keep_io_types``) so callers and the
agent feed the same arrays.

Where it pays: execution providers with fp16 kernels (CUDA, DirectML, Core ML, NNAPI/QNN) and ARM CPUs
with fp16 arithmetic. Where it does not: onnxruntime's CPU EP on x86 has few fp16 kernels and inserts
casts around the rest -- measured here 0.64x the speed of fp32 (median thread CPU time) on the zoo's MobileNetV2 (Intel Xeon, AVX-512 VNNI,
onnxruntime 1.32, 1 thread) -- so it is not among the x86 search candidates; TFLite fp16 is the
``convert`` step's ``precision: fp16``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import PassError
from ..formats import Format
from ..logs import quiet
from .base import Pass, PassContext, PassOutput


class Fp16Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keep_io_types: bool = Field(True, description="float32 inputs and outputs (casts at the edges)")
    op_block_list: list[str] | None = Field(None, description="op types kept in float32 (None: the converter's list)")
    node_block_list: list[str] = Field(default_factory=list, description="node names kept in float32")


class Fp16Convert(Pass):
    name = "quantize_fp16"
    Config = Fp16Config
    input_formats = (Format.ONNX,)

    def run(self, artifact, config: Fp16Config, ctx: PassContext, stem: str) -> PassOutput:
        import onnx

        out = ctx.workdir / f"{stem}.onnx"
        tmp = ctx.workdir / f".{stem}.partial.onnx"
        try:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            with quiet("root", "onnxruntime"):
                model = convert_float_to_float16(
                    onnx.load(str(Path(artifact.path))), keep_io_types=config.keep_io_types,
                    op_block_list=config.op_block_list, node_block_list=config.node_block_list or None)
            onnx.save(model, str(tmp))
            tmp.replace(out)
        except Exception as exc:  # the converter and onnx raise plain Exceptions of many kinds
            raise PassError(f"fp16 conversion failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                            hint="keep the failing op types in float32 with op_block_list") from exc
        finally:
            tmp.unlink(missing_ok=True)
        return PassOutput(path=out, precision="fp16", metrics={"converter": "onnxruntime.transformers.float16",
                                                               "keep_io_types": config.keep_io_types})
