"""Each decoder file proven against the PyTorch model before it reaches a device, with the agent's own
decoder code run here (the same bytes the device runs):

- **prefill**: the file's logits for a whole window against the float model's (fp32 files: within
  ``FP32_ATOL + FP32_RTOL x max|logit|``; quantized files: not gross breakage, mean row cosine >= ``MIN_COSINE``);
- **the cache**: the same window as a prompt and then one token at a time through the cache equals the
  file's own full-window forward within the fp32 tolerance; a quantized file whose activations are quantized
  at run time (per block: the kernels for one row and for many may round differently) within half its own
  error against PyTorch, or the fp32 tolerance if larger; where a runtime's kernels differ by batch size
  (llama.cpp), decoding through the cache as close to PyTorch as the full forward (1.5x its error). A broken
  cache misses by the size of the logits.

A file out of tolerance is dropped with the figures (``ConversionError``); the lineage records them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..agent.inprocess import load_agent
from ..artifact import Artifact
from ..errors import ConversionError
from ..formats import format_spec

FP32_ATOL, FP32_RTOL = 1e-4, 1e-3
MIN_COSINE = 0.9


def _runtime(art: Artifact) -> str:
    return str(format_spec(art.format).runtime)


def open_decoder(art: Artifact, context: int, threads: int = 1) -> Any:
    cls = load_agent().runners.decoder_for(_runtime(art))
    return cls.open(str(art.path), {"threads": threads, "generate": {"context": context}})


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    num = (a * b).sum(axis=-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12
    return float((num / den).mean())


def cache_parity(
    art: Artifact, model: Any, tokens: list[int], *, context: int, prefix: int | None = None, decoder: Any = None
) -> dict[str, Any]:
    """The two checks above on ``tokens``; returns the figures, raises ConversionError when out of tolerance."""
    import torch

    dec = decoder or open_decoder(art, context)
    t = len(tokens)
    prefix = prefix or max(1, t // 2)
    full = dec.forward(tokens, 0)
    steps = [dec.forward(tokens[:prefix], 0)] + [dec.forward([tokens[j]], j) for j in range(prefix, t)]
    through_cache = np.concatenate(steps, axis=0)
    with torch.no_grad():
        ref = model(torch.as_tensor([tokens])).logits[0].double().numpy()
    scale = float(np.abs(ref).max())
    fp32_tol = FP32_ATOL + FP32_RTOL * scale
    prefill_err = float(np.abs(full - ref).max())
    cache_err = float(np.abs(through_cache - full).max())
    tol = fp32_tol if art.precision == "fp32" else max(fp32_tol, 0.5 * prefill_err)
    # a quantized file's kernels may differ by batch size (llama.cpp switches matmul kernels for long prompts):
    # then decoding through the cache must be as close to PyTorch as the full forward is (a broken cache misses
    # by the size of the logits, not by the quantization error)
    cache_vs_ref = float(np.abs(through_cache - ref).max())
    kernel_tol = fp32_tol + 1.5 * prefill_err
    cosine = _cosine(full, ref)
    out: dict[str, object] = {
        "tokens": t,
        "prefix": prefix,
        "prefill_max_abs_err": prefill_err,
        "cache_max_abs_err": cache_err,
        "cache_vs_pytorch_max_abs_err": cache_vs_ref,
        "logit_scale": scale,
        "tolerance": tol,
        "prefill_cosine": cosine,
        "top1_agreement": float((full.argmax(-1) == ref.argmax(-1)).mean()),
    }
    hop = f"{art.format.value} {art.precision} decoder"
    if cache_err > tol and art.precision != "fp32" and cache_vs_ref <= kernel_tol:
        out["cache_judged_by"] = (
            f"decode through the cache vs PyTorch {cache_vs_ref:.3g} <= 1.5 x the full "
            f"forward's {prefill_err:.3g} (+ the fp32 tolerance): the kernels differ by "
            "batch size"
        )
    elif cache_err > tol:
        raise ConversionError(
            f"decoding through the KV cache differs from the full-sequence forward by "
            f"{cache_err:.3g} (tolerance {tol:.3g}) on {t} tokens: the cache is broken",
            hop=hop,
            hint="the exporter or the runtime mishandles past key/values",
        )
    if art.precision == "fp32" and prefill_err > fp32_tol:
        raise ConversionError(
            f"prefill logits differ from PyTorch's by {prefill_err:.3g} (tolerance {tol:.3g})", hop=hop
        )
    if cosine < MIN_COSINE:
        raise ConversionError(
            f"prefill logits are broken against PyTorch's: mean cosine {cosine:.3f} "
            f"< {MIN_COSINE}, max error {prefill_err:.3g} at a logit scale of {scale:.3g}",
            hop=hop,
            hint="the quantized file computes something else than the model (a lowering bug)",
        )
    return out
