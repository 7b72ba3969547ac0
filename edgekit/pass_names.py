"""Pass names -> where each pass is implemented (``module:Class``): the names a recipe may use, checked when it
loads (``inputs/recipe.py``), and the table the pass registry reads (``passes/registry.get_pass``; plug-ins add a
row with ``passes.registry.register``). Data only, like ``formats.FORMATS``' hops: nothing here imports a pass,
so it sits in the root layer, below the recipe."""

from __future__ import annotations

PASSES: dict[str, str] = {
    "quantize": "edgekit.passes.quantize_ort:OrtQuantize",
    "convert": "edgekit.passes.convert:Convert",
    "quantize_accuracy_aware": "edgekit.passes.accuracy_aware.quantize:AccuracyAwareQuantize",
    "quantize_fp16": "edgekit.passes.quantize_fp16:Fp16Convert",
    "quantize_qat": "edgekit.passes.quantize_qat:QatQuantize",
    "quantize_inc": "edgekit.passes.quantize_inc:IncQuantize",
    "quantize_nncf": "edgekit.passes.quantize_nncf:QuantizeNncf",
    "prune_magnitude": "edgekit.passes.prune_magnitude:MagnitudePrune",
    "prune_structured": "edgekit.passes.prune_structured:StructuredPrune",
    "prune_widths": "edgekit.passes.prune_latency:PruneWidths",
    "distill": "edgekit.passes.distill:Distill",
}


def known_passes() -> list[str]:
    return sorted(PASSES)
