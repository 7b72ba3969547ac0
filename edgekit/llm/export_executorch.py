"""ExecuTorch ``.pte`` with a static KV cache, lowered to XNNPACK (the agent's ``ExecuTorchDecoder``).

transformers' own export recipe (``TorchExportableModuleWithStaticCache``) holds the cache as the program's
mutable buffers of ``context`` positions: ``forward(input_ids [1, S], cache_position [S]) -> logits``, the
signature ExecuTorch's LLM runner calls. The program is exported with ``strict=True`` (torch 2.13 with
executorch 1.5.1: a non-strict export of the mutated buffers fails in ExecuTorch's decompositions).

INT8 is weight-only, per output channel, in the form ExecuTorch's own LLM quantizer (``qmode="int8"``) writes
(int8 weights cast and scaled inside the linear; the activations stay float, so decode through the cache
matches a full forward), with the bias that quantizer drops kept (its module has none: Qwen2's q/k/v biases
made its state dict fail to load).
torchao's ``IntxWeightOnlyConfig`` int8 lowered to XNNPACK with executorch 1.5.1 returned logits off by ~1e3
on a tiny Llama here (garbage that still runs): the parity check drops such a file with that reason."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import ConversionError, MissingExtraError
from ..formats import Format
from ..fsutil import atomic_path
from .layer_plan import LayerChoice
from .source import LMSource

HOP = "torch->executorch (static KV cache, XNNPACK)"


def et_io(src: LMSource) -> IOSpec:
    return IOSpec(
        inputs=(
            TensorSpec(name="input_ids", shape=(1, None), dtype="int64"),
            TensorSpec(name="cache_position", shape=(None,), dtype="int64"),
        ),
        outputs=(TensorSpec(name="logits", shape=(1, None, src.vocab_size), dtype="float32"),),
    )


def int8_weight_only(model: Any) -> dict[str, Any]:
    """Every ``nn.Linear`` becomes an int8 linear (``_int8_linear_class``: weights int8, symmetric, one scale per output
    channel; the bias kept, in float); the embedding stays float. Returns the account: what became what."""
    import torch

    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        # tied embeddings (Qwen2, Gemma): the output layer gets its own (quantized) copy, the input embedding
        # stays float
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    quantized = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, _int8_linear_class().from_linear(child))
                quantized.append(name)
    return {"int8_linear_layers": len(quantized), "float": ["embeddings", "norms"]}


@functools.lru_cache(maxsize=None)
def _int8_linear_class() -> Any:
    """The module class, built on first use (torch stays out of this module's import)."""
    import torch

    class _Int8Linear(torch.nn.Module):
        """``linear(x, int8 weight -> float) * per-channel scale + bias``: the form ExecuTorch's own int8
        weight-only LLM quantizer writes (``WeightOnlyInt8Linear``), with the bias it drops (Qwen2's q/k/v)."""

        weight: torch.Tensor  # int8 (out, in), a buffer
        scales: torch.Tensor  # float (out,), a buffer

        def __init__(self, weight: Any, scales: Any, bias: Any) -> None:
            super().__init__()
            self.register_buffer("weight", weight)
            self.register_buffer("scales", scales)
            self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

        @classmethod
        def from_linear(cls, lin: Any) -> Any:
            w = lin.weight.detach().float()
            scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            q = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
            return cls(q, scales, None if lin.bias is None else lin.bias.detach().clone())

        def forward(self, x: Any) -> Any:
            y = torch.nn.functional.linear(x, self.weight.to(dtype=x.dtype)) * self.scales
            return y if self.bias is None else y + self.bias

    return _Int8Linear


def _quantized_copy(src: LMSource, precision: str, plan: list[LayerChoice] | None) -> tuple[Any, dict[str, Any]]:
    import copy

    model = copy.deepcopy(src.model)
    if precision == "fp32":
        return model, {}
    import torch

    head = model.get_output_embeddings()
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if not linears:  # a quantized file that quantized nothing must not be raced as one
        raise ConversionError(
            f"{src.architecture} has no nn.Linear layer besides the output layer: {precision} would quantize nothing",
            hop=HOP,
        )
    if precision == "int8":
        return model, int8_weight_only(model)
    if precision == "8da8w":
        return model, dynamic_int8(model)
    if precision == "8da4w":
        if plan is None:
            raise ValueError("8da4w needs a layer plan (layer_plan.plan_int4)")
        return model, dynamic_int4(model, plan)
    raise ValueError(f"ExecuTorch decoder precision {precision!r}: fp32, int8, 8da8w or 8da4w")


def dynamic_int4(model: Any, plan: list[LayerChoice]) -> dict[str, Any]:
    """8da4w: int4 weights in groups along the input (the plan's group), activations quantized to int8 per
    token at run time (torchao's ``Int8DynamicActivationIntxWeightConfig``, XNNPACK's QD8 x QC4W kernels); the
    plan's int8 layers at 8da8w per channel, its float layers untouched. Returns the layers by scheme."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    by = {c.name: c for c in plan if c.kind != "embedding"}
    for scheme in ("int4", "int8"):
        names = {n for n, c in by.items() if c.scheme == scheme}
        groups = {by[n].group for n in names}
        for g in groups:
            chosen = {n for n in names if by[n].group == g}
            gran = PerGroup(g) if g else PerAxis(0)
            cfg = Int8DynamicActivationIntxWeightConfig(
                # torch has the int4 dtype (2.6+); its type stubs do not list it
                weight_dtype=torch.int4 if scheme == "int4" else torch.int8,  # type: ignore[attr-defined]
                weight_granularity=gran,
            )
            quantize_(
                model, cfg, filter_fn=lambda m, fqn, chosen=chosen: isinstance(m, torch.nn.Linear) and fqn in chosen
            )
    return {"activations": "int8 per token, dynamic"}


def dynamic_int8(model: Any) -> dict[str, Any]:
    """8da8w: int8 weights per output channel, activations quantized to int8 per token at run time (torchao's
    ``Int8DynamicActivationIntxWeightConfig``, which XNNPACK runs on its QD8 kernels). Per token, so decoding
    through the cache computes what a full forward computes. Measured on a 125M Llama (1 thread, AMX Xeon):
    51.3 decode tok/s against fp32's 25.4 and weight-only int8's 2.2."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    n = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0)))
    return {"int8_linear_layers": n, "activations": "int8 per token, dynamic", "float": ["embeddings", "norms"]}


def runner_metadata(src: LMSource, context: int) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads (as its own ``export_llm`` writes them), so the file
    also runs under ``TextLLMRunner`` / ``llama_main`` with their statistics."""
    meta: dict[str, Any] = {
        "get_max_seq_len": context,
        "get_max_context_len": context,
        "get_n_layers": src.layers,
        "get_vocab_size": src.vocab_size,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": True,
    }
    bos, eos = getattr(src.tokenizer, "bos_token_id", None), getattr(src.tokenizer, "eos_token_id", None)
    if bos is not None:
        meta["get_bos_id"] = int(bos)
    if eos is not None:
        meta["get_eos_ids"] = [int(eos)]
    return meta


def export_executorch(
    src: LMSource,
    dest: Path,
    *,
    context: int,
    precision: str = "fp32",
    plan: list[LayerChoice] | None = None,
    plan_account: dict[str, Any] | None = None,
) -> Artifact:
    """The decoder as a .pte at ``dest`` (``precision``: fp32, int8 weight-only, 8da8w, or 8da4w by ``plan``)."""
    import torch

    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
        from transformers import GenerationConfig
        from transformers.integrations.executorch import (
            TorchExportableModuleWithStaticCache,
        )
    except ImportError as exc:
        raise MissingExtraError("executorch", "executorch", "an ExecuTorch decoder") from exc
    t0 = time.perf_counter()
    try:
        model, account = _quantized_copy(src, precision, plan)
        if plan_account is not None:
            account = {**account, **plan_account}
        # transformers leaves GenerationConfig's constructor unannotated
        model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
            use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": context}
        )
        w = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=context).eval()
        seq = torch.export.Dim("seq", min=1, max=context - 1)
        with torch.no_grad():
            ep = torch.export.export(
                w,
                (),
                {"input_ids": torch.zeros((1, 4), dtype=torch.long), "cache_position": torch.arange(4)},
                dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
                strict=True,
            )
        et = to_edge_transform_and_lower(
            ep,
            partitioner=[XnnpackPartitioner()],
            constant_methods=runner_metadata(src, context),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        ).to_executorch()
    except Exception as exc:  # the exporter's own failure is the variant's reason
        raise ConversionError(
            f"{src.architecture} at {precision}: {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}",
            hop=HOP,
        ) from exc
    with atomic_path(dest) as tmp:
        tmp.write_bytes(et.buffer)
    step = LineageStep(
        kind="convert",
        name=HOP,
        seconds=round(time.perf_counter() - t0, 3),
        config={
            "cache": "static",
            "context": context,
            "backend": "xnnpack",
            **(
                {
                    "quantize": {
                        "int8": "int8 weight-only, symmetric, per output channel",
                        "8da8w": "int8 weights per channel, int8 activations per token",
                        "8da4w": "int4 weights in groups, int8 activations per token",
                    }[precision]
                }
                if precision != "fp32"
                else {}
            ),
        },
        metrics={"quantization": account} if account else {},
    )
    label = {"fp32": "fp32", "8da4w": "int4"}.get(precision, "int8")
    return Artifact.from_file(dest, Format.EXECUTORCH, et_io(src), precision=label, lineage=[step])
