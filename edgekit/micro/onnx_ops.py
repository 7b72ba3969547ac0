"""An ONNX graph checked against TFLite Micro's kernels before any conversion work: every ONNX op is mapped to the
TFLite builtins onnx2tf lowers it to (``LOWERING``, edgekit's table, from onnx2tf's op handlers and TensorFlow's
TFLite converter as run here), and each builtin must be in the installed TFLM's kernel list (``kernels.py``). An
op with no mapping or no kernel is refused with the PyTorch layer it comes from (the exporter's node metadata) and
the ONNX node's name. The converted file is checked again, op by op, against the same list, and the interpreter
itself has the last word when it allocates (``interpreter.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..convert.onnx_modules import module_of
from ..errors import BadInputError
from .kernels import SOURCE, tflm_kernels

if TYPE_CHECKING:
    from onnx import NodeProto

# ONNX op -> the TFLite builtins it becomes in a full-integer INT8 file (any of them may appear); () = folded away
LOWERING: dict[str, tuple[str, ...]] = {
    "Conv": ("CONV_2D", "DEPTHWISE_CONV_2D", "RESHAPE", "EXPAND_DIMS", "SPLIT", "CONCATENATION", "PAD"),
    "ConvTranspose": ("TRANSPOSE_CONV",),
    "Gemm": ("FULLY_CONNECTED",), "MatMul": ("FULLY_CONNECTED", "BATCH_MATMUL"),
    "Relu": ("RELU",), "Clip": ("RELU6", "RELU", "MINIMUM", "MAXIMUM"), "LeakyRelu": ("LEAKY_RELU",),
    "PRelu": ("PRELU",), "Sigmoid": ("LOGISTIC",), "Tanh": ("TANH",), "HardSwish": ("HARD_SWISH",),
    "HardSigmoid": ("MUL", "ADD", "RELU6", "MINIMUM", "MAXIMUM"), "Elu": ("ELU",),
    "Softmax": ("SOFTMAX",), "LogSoftmax": ("LOG_SOFTMAX",),
    "Add": ("ADD",), "Sub": ("SUB",), "Mul": ("MUL",), "Div": ("DIV", "MUL"), "Max": ("MAXIMUM",),
    "Min": ("MINIMUM",), "Sqrt": ("SQRT",), "Exp": ("EXP",), "Log": ("LOG",), "Abs": ("ABS",), "Neg": ("NEG",),
    "Floor": ("FLOOR",), "Ceil": ("CEIL",), "Round": ("ROUND",), "Sin": ("SIN",), "Cos": ("COS",),
    "Equal": ("EQUAL",), "Greater": ("GREATER",), "Less": ("LESS",), "Where": ("SELECT_V2",),
    "Cast": ("CAST",), "ArgMax": ("ARG_MAX",), "ArgMin": ("ARG_MIN",),
    "MaxPool": ("MAX_POOL_2D", "PAD", "PADV2"), "AveragePool": ("AVERAGE_POOL_2D", "PAD"),
    "GlobalAveragePool": ("MEAN", "AVERAGE_POOL_2D"), "GlobalMaxPool": ("REDUCE_MAX", "MAX_POOL_2D"),
    "ReduceMean": ("MEAN",), "ReduceMax": ("REDUCE_MAX",), "ReduceMin": ("REDUCE_MIN",), "ReduceSum": ("SUM",),
    "Flatten": ("RESHAPE",), "Reshape": ("RESHAPE",), "Transpose": ("TRANSPOSE",), "Squeeze": ("SQUEEZE", "RESHAPE"),
    "Unsqueeze": ("EXPAND_DIMS", "RESHAPE"), "Concat": ("CONCATENATION",), "Split": ("SPLIT", "SPLIT_V"),
    "Slice": ("STRIDED_SLICE", "SLICE"), "Gather": ("GATHER",), "Pad": ("PAD", "PADV2", "MIRROR_PAD"),
    "Expand": ("BROADCAST_TO",), "DepthToSpace": ("DEPTH_TO_SPACE",), "SpaceToDepth": ("SPACE_TO_DEPTH",),
    "Resize": ("RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"),
    "BatchNormalization": ("MUL", "ADD"),  # folded into the conv before it where there is one
    "Identity": (), "Dropout": (), "Constant": (), "Shape": (), "ConstantOfShape": (),  # folded at conversion
    # TFLite builtins TFLM has no kernel for, named so the refusal says which one
    "Gelu": ("GELU",), "Pow": ("POW",), "Tile": ("TILE",), "TopK": ("TOPK_V2",),
    "Einsum": ("EINSUM",), "NonMaxSuppression": ("NON_MAX_SUPPRESSION_V5",), "Range": ("RANGE",),
    "Softplus": ("SOFTPLUS",),
}


@dataclass(frozen=True)
class Unsupported:
    layer: str  # the PyTorch module path (class), or the ONNX node's name without exporter metadata
    node: str  # the ONNX node's name
    op: str  # the ONNX op type
    why: str  # which TFLite builtin has no TFLM kernel, or that edgekit knows no lowering for the op

    def line(self) -> str:
        return f"layer {self.layer} (ONNX node {self.node}, {self.op}): {self.why}"


def layer_of(node: NodeProto) -> str:
    """The PyTorch module a node comes from (``features.3 (Conv2d)``), from the exporter's metadata
    (``convert/onnx_modules.module_of``); the node's name without it."""
    found = module_of(node)
    if found is None:
        return node.name or node.op_type
    module, cls = found
    module = module or "(the model's forward)"
    return f"{module} ({cls})" if cls else module


def unsupported_ops(onnx_path: str | Path) -> list[Unsupported]:
    """Every node of the ONNX graph whose op has no TFLM kernel (or no known lowering), in graph order."""
    import onnx  # heavy: protobuf

    kernels = tflm_kernels()
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    out: list[Unsupported] = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            out.append(Unsupported(layer_of(node), node.name, f"{node.domain}.{node.op_type}",
                                   "a custom-domain op: TFLM runs TFLite builtins only"))
            continue
        builtins = LOWERING.get(node.op_type)
        if builtins is None:
            out.append(Unsupported(layer_of(node), node.name, node.op_type,
                                   "no TFLite builtin with a TFLM kernel computes it (e.g. Erf, exact GELU's, "
                                   "becomes a TensorFlow Flex op)" if node.op_type == "Erf" else
                                   "edgekit knows no TFLite lowering of it that TFLM has a kernel for"))
            continue
        missing = [b for b in builtins if b not in kernels]
        if builtins and len(missing) == len(builtins):
            out.append(Unsupported(layer_of(node), node.name, node.op_type,
                                   f"becomes TFLite {'/'.join(missing)}, which TFLM has no kernel for"))
    return out


def refuse_unsupported(onnx_path: str | Path) -> None:
    """BadInputError naming every layer whose op TFLM cannot run, before any conversion work."""
    bad = unsupported_ops(onnx_path)
    if bad:
        lines = "\n".join(f"  - {b.line()}" for b in bad[:12]) + (f"\n  ... {len(bad) - 12} more" if len(bad) > 12
                                                                     else "")
        raise BadInputError(f"{len(bad)} op(s) have no TFLite Micro kernel (checked against the {SOURCE}):\n{lines}",
                            hint="replace those layers with ones TFLM runs (e.g. GELU -> ReLU, a Tile -> a "
                            "broadcast Add), or target a runtime that has them")
