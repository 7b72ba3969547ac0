"""ONNX with past key/values, for plain ONNX Runtime (the agent's ``OnnxDecoder``).

Why plain onnxruntime and not onnxruntime-genai: onnxruntime is already the runtime on every device edgekit
provisions (aarch64 wheels included) and the agent times each forward itself, so the same harness times
prefill and every decode step on every runtime; GenAI would add a second native package and its own config
and generation loop whose timings edgekit could only read, not take per token. The file uses the I/O layout
optimum and GenAI use (``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.N.key|value`` ->
``logits``, ``present.N.key|value``), so it also runs under GenAI with a genai_config.

The graph comes from ``torch.onnx.export(dynamo=True)`` over a wrapper that rebuilds transformers' own
``DynamicCache`` from the past tensors, so any ``*ForCausalLM`` transformers ships exports with its own
attention code. INT8 is ONNX Runtime's ``MatMulNBits`` at 8 bits (symmetric blocks of 32 along the input
dimension) with ``accuracy_level`` 4: the activations are quantized to int8 per block at run time and the
product runs on int8 kernels. Measured on a 125M Llama (1 thread, AMX Xeon): 119.7 decode tok/s against
fp32's 36.3, where the same weights with float activations (accuracy level 0, weight-only) ran at 4.2 tok/s.
Its quantized activations make decode through the cache differ slightly from a full forward (0.03 on logits of
scale 2.8 there): the cache check allows half the file's own error against PyTorch (parity.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import ConversionError
from ..formats import Format
from ..fsutil import atomic_path
from .source import LMSource

HOP = "torch->onnx (KV cache)"


def io_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    present = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def lm_io(src: LMSource) -> IOSpec:
    """The decoder's interface as the report records it (the cache inputs left out: the runner owns them)."""
    return IOSpec(
        inputs=(
            TensorSpec(name="input_ids", shape=(1, None), dtype="int64"),
            TensorSpec(name="position_ids", shape=(1, None), dtype="int64"),
        ),
        outputs=(TensorSpec(name="logits", shape=(1, None, src.vocab_size), dtype="float32"),),
    )


def _wrapper(src: LMSource) -> Any:
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import CacheLayerMixin

    layers = src.layers

    class WithPast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = src.model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> Any:
            cache = DynamicCache(config=self.lm.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.lm(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
            present: list[Any] = []
            for layer in cache.layers:
                if not isinstance(layer, CacheLayerMixin):  # linear attention, or a layer without a cache
                    raise ConversionError(
                        f"cache layer {type(layer).__name__} keeps no keys and values: this export takes "
                        "attention decoders only",
                        hop=HOP,
                    )
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return WithPast().eval()


def export_onnx(src: LMSource, dest: Path, *, context: int) -> Artifact:
    """The float decoder as ONNX at ``dest``, its lineage step recording the export."""
    import torch

    t0 = time.perf_counter()
    w = _wrapper(src)
    past_len, seq = 3, 4
    ids = torch.zeros((1, seq), dtype=torch.long)
    mask = torch.ones((1, past_len + seq), dtype=torch.long)
    pos = torch.arange(past_len, past_len + seq)[None]
    past = tuple(torch.zeros(1, src.kv_heads, past_len, src.head_dim) for _ in range(2 * src.layers))
    d_seq = torch.export.Dim("seq", min=1, max=max(2, context))
    d_past = torch.export.Dim("past", min=0, max=max(2, context))
    d_total = torch.export.Dim("total", min=1, max=max(2, 2 * context))
    shapes = ({1: d_seq}, {1: d_total}, {1: d_seq}, tuple({2: d_past} for _ in past))
    ins, outs = io_names(src.layers)
    with atomic_path(dest) as tmp:
        try:
            with torch.no_grad():
                torch.onnx.export(
                    w,
                    (ids, mask, pos, *past),
                    str(tmp),
                    dynamo=True,
                    dynamic_shapes=shapes,
                    input_names=ins,
                    output_names=outs,
                    optimize=True,
                    verbose=False,
                    external_data=False,
                )
        except Exception as exc:  # the exporter's own failure is the variant's reason
            raise ConversionError(
                f"{src.architecture}: torch.onnx.export failed: {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0][:400]}",
                hop=HOP,
            ) from exc
    return Artifact.from_file(
        dest,
        Format.ONNX,
        lm_io(src),
        precision="fp32",
        lineage=[
            LineageStep(
                kind="convert",
                name=HOP,
                seconds=round(time.perf_counter() - t0, 3),
                config={"exporter": "torch.onnx.export(dynamo=True)", "cache": "past/present key values"},
            )
        ],
    )


def matmul_layers(model: Any) -> dict[str, str]:
    """{ONNX MatMul node: the transformers module it computes} from the exporter's name scopes (a linear layer's
    node carries its module path, "lm.model.layers.0.self_attn.q_proj", in ``pkg.torch.onnx.name_scopes``)."""
    import ast

    out = {}
    for n in model.graph.node:
        if n.op_type != "MatMul":
            continue
        md = {p.key: p.value for p in n.metadata_props}
        try:
            scopes = ast.literal_eval(md.get("pkg.torch.onnx.name_scopes", "[]"))
            classes = ast.literal_eval(md.get("pkg.torch.onnx.class_hierarchy", "[]"))
        except (ValueError, SyntaxError):
            continue
        for scope, cls in zip(scopes, classes):
            if cls == "torch.nn.modules.linear.Linear":
                out[n.name] = scope[len("lm.") :] if scope.startswith("lm.") else scope
    return out


def quantize_onnx_int8(art: Artifact, dest: Path, *, block_size: int = 32, accuracy_level: int = 4) -> Artifact:
    """INT8 weights (``MatMulNBits``, 8 bits, symmetric blocks along the input dimension), computed in int8
    (``accuracy_level`` 4; 0 keeps float activations: weight-only, and slow on CPU)."""
    return quantize_onnx_nbits(
        art, dest, int8=None, int4=set(), block_size=block_size, accuracy_level=accuracy_level, precision="int8"
    )


def quantize_onnx_nbits(
    art: Artifact,
    dest: Path,
    *,
    int4: set[str],
    int8: set[str] | None,
    block_size: int = 32,
    accuracy_level: int = 4,
    precision: str = "int4",
    plan_account: dict[str, Any] | None = None,
) -> Artifact:
    """``MatMulNBits`` at 4 bits for the modules in ``int4`` and 8 bits for those in ``int8`` (None: every other
    MatMul with a constant weight), symmetric blocks of ``block_size`` along the input (the last zero-padded),
    computed in int8 at ``accuracy_level`` 4. The lineage records which node became what; a module the plan
    named that the file does not hold quantized (a weight shared with the embedding is not a constant of the
    MatMul) is listed under ``float_matmuls_left`` with its module name."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line a node
    t0 = time.perf_counter()
    model = onnx.load(str(art.path))
    names = matmul_layers(model)
    inits = {i.name for i in model.graph.initializer}
    const = {n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    before = {n.name for n in model.graph.node if n.op_type == "MatMulNBits"}  # an input quantized already
    nodes4 = {n for n in const if names.get(n) in int4}
    nodes8 = const - nodes4 if int8 is None else {n for n in const if names.get(n) in int8}
    for bits, nodes in ((4, nodes4), (8, nodes8)):
        if not nodes:
            continue
        cfg = DefaultWeightOnlyQuantConfig(
            block_size=block_size, is_symmetric=True, bits=bits, accuracy_level=accuracy_level
        )
        q = MatMulNBitsQuantizer(
            model,
            bits=bits,
            block_size=block_size,
            is_symmetric=True,
            accuracy_level=accuracy_level,
            algo_config=cfg,
            nodes_to_exclude=sorted(const - nodes),
        )
        try:
            q.process()
        except Exception as exc:
            raise ConversionError(
                f"onnxruntime's MatMulNBits quantizer ({bits} bits) failed: {type(exc).__name__}: {exc}",
                hop=f"onnx {precision}",
            ) from exc
        model = q.model.model
    by_node: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type == "MatMulNBits" and n.name not in before:
            bits = next((a.i for a in n.attribute if a.name == "bits"), 0)
            by_node[n.name] = f"int{bits}"
    if not by_node:  # a quantized file that quantized nothing must not be raced as one
        raise ConversionError(
            f"no MatMul with a constant weight to quantize in {art.path.name} (its linear layers are other ops)",
            hop=f"onnx {precision}",
        )
    inits = {i.name for i in model.graph.initializer}
    left = [
        names.get(n.name, n.name)
        for n in model.graph.node
        if n.op_type == "MatMul" and (n.input[1] in inits or names.get(n.name))
    ]
    with atomic_path(dest) as tmp:
        onnx.save(model, str(tmp))
    counts = {b: sum(v == b for v in by_node.values()) for b in ("int4", "int8")}
    metrics: dict[str, Any] = {
        "quantized_matmuls": len(by_node),
        "int4_matmuls": counts["int4"],
        "int8_matmuls": counts["int8"],
        "float_matmuls_left": left,
    }
    if plan_account is not None:
        metrics["quantization"] = plan_account
    return art.derive(
        dest,
        precision=precision,
        step=LineageStep(
            kind="pass",
            name=f"quantize (onnx {precision})",
            seconds=round(time.perf_counter() - t0, 3),
            config={
                "op": "MatMulNBits",
                "bits": 4 if nodes4 else 8,
                "block_size": block_size,
                "symmetric": True,
                "accuracy_level": accuracy_level,
            },
            metrics=metrics,
        ),
    )
