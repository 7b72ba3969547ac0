"""What each layer of a language model becomes in a low-bit file, decided before any export and written into
the file's lineage as its account (issue #37): every linear layer and the embedding, named, with the scheme it
gets and, for each that does not get the variant's headline scheme, why.

- **int4** is symmetric and group-wise along the input dimension (``group`` weights share a scale), as both
  ExecuTorch's ``8da4w`` and ONNX Runtime's 4-bit ``MatMulNBits`` store it. A layer whose input width the group
  does not divide is never skipped silently: where the runtime pads the last group (``MatMulNBits``) the account
  says so; where it cannot (torchao's group-wise int4), the layer is kept at int8 per channel and named.
- **the output layer** (``lm_head``) is an explicit choice (``head``: float, int8 or int4; default int8: it
  decides every token's probabilities, and int4 there costs perplexity first); the **embedding** stays float
  (a row gather, not a matmul: int4 there saves memory, not time), said in the account.
- **the recovery ladder** names layers to keep at int8 (``keep_int8``), chosen by their measured sensitivity.

:func:`layer_errors` measures each layer's output error on text: the layer's recorded inputs from the float
model times its weights quantized by its scheme (fake quantization in float, the scheme's rounding exactly),
against the float output, as a relative RMS error. That is the sensitivity the ladder ranks by."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

HEADS = ("float", "int8", "int4")
OUTPUT_NAMES = ("lm_head",)


@dataclass(frozen=True)
class LayerChoice:
    name: str  # the module's name in the transformers model ("model.layers.0.mlp.down_proj")
    kind: str  # "linear", "output" or "embedding"
    shape: tuple[int, int]  # (out, in) for a linear; (vocab, width) for the embedding
    scheme: str  # "int4", "int8" or "float"
    group: int | None  # weights a scale along the input; None: one scale per output channel
    reason: str | None = None  # why not the variant's headline scheme (or how it was fitted)

    def label(self) -> str:
        if self.scheme == "float":
            return "float"
        return f"{self.scheme} g{self.group}" if self.group else f"{self.scheme} per channel"


def linear_layers(model: Any) -> list[tuple[str, Any]]:
    import torch

    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def plan_int4(
    model: Any,
    *,
    group: int,
    head: str = "int8",
    keep_int8: Iterable[str] = (),
    pads: bool = False,
    int8_group: int | None = None,
    ladder_note: dict[str, str] | None = None,
) -> list[LayerChoice]:
    """The plan for an int4 variant. ``pads``: the runtime pads an input width the group does not divide
    (ONNX Runtime's MatMulNBits) instead of refusing it (torchao). ``int8_group``: how the runtime stores its
    int8 layers (MatMulNBits: blocks of 32; None: one scale per output channel, as XNNPACK's QD8)."""
    import torch

    if head not in HEADS:
        raise ValueError(f"head={head!r}: one of {HEADS}")
    keep = set(keep_int8)
    plan: list[LayerChoice] = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Embedding):
            plan.append(
                LayerChoice(
                    name,
                    "embedding",
                    (int(mod.num_embeddings), int(mod.embedding_dim)),  # the weight's (vocab, width)
                    "float",
                    None,
                    "the embedding stays float: a row gather per token, not a matmul",
                )
            )
    for name, mod in linear_layers(model):
        out_f, in_f = int(mod.out_features), int(mod.in_features)
        is_head = name.split(".")[-1] in OUTPUT_NAMES
        kind = "output" if is_head else "linear"
        if name in keep:
            why = (ladder_note or {}).get(name, "kept at int8 by the recovery ladder")
            plan.append(LayerChoice(name, kind, (out_f, in_f), "int8", int8_group, why))
        elif is_head and head != "int4":
            plan.append(
                LayerChoice(
                    name,
                    kind,
                    (out_f, in_f),
                    head,
                    int8_group if head == "int8" else None,
                    f"the output layer at {head}: an explicit choice (head={head})",
                )
            )
        elif in_f % group:
            if pads:
                plan.append(
                    LayerChoice(
                        name,
                        kind,
                        (out_f, in_f),
                        "int4",
                        group,
                        f"input width {in_f} is not a multiple of the group {group}: the last "
                        f"group is zero-padded to {-(-in_f // group) * group}",
                    )
                )
            else:
                plan.append(
                    LayerChoice(
                        name,
                        kind,
                        (out_f, in_f),
                        "int8",
                        int8_group,
                        f"input width {in_f} is not a multiple of the group {group}: kept at "
                        "int8 per channel (group-wise int4 needs whole groups)",
                    )
                )
        else:
            plan.append(LayerChoice(name, kind, (out_f, in_f), "int4", group))
    return plan


def fake_quant(w: Any, scheme: str, group: int | None) -> Any:
    """``w`` [out, in] rounded as the scheme stores it (symmetric, in groups of ``group`` along the input,
    the last zero-padded, or one scale per output row when ``group`` is None), returned in float."""
    import torch

    if scheme == "float":
        return w
    qmax = {"int8": 127.0, "int4": 7.0}[scheme]
    out_f, in_f = w.shape
    group = group or in_f
    pad = -in_f % group
    wp = torch.nn.functional.pad(w, (0, pad)).reshape(out_f, -1, group)
    scale = (wp.abs().amax(dim=2, keepdim=True) / qmax).clamp(min=1e-12)
    q = torch.clamp(torch.round(wp / scale), -qmax - 1, qmax) * scale
    return q.reshape(out_f, -1)[:, :in_f]


def layer_errors(
    model: Any,
    windows: np.ndarray,
    plan: list[LayerChoice],
    *,
    schemes: dict[str, tuple[str, int | None]] | None = None,
) -> dict[str, float]:
    """Each planned linear layer's relative RMS output error ``||X Wq^T - X W^T|| / ||X W^T||`` on ``windows``
    (the float model's own activations as X). ``schemes`` overrides a layer's scheme (the ladder asks what each
    layer costs at int4 even where the plan kept it at int8)."""
    import torch

    mods = dict(linear_layers(model))
    wanted = {c.name: (c.scheme, c.group) for c in plan if c.kind != "embedding"}
    wanted.update(schemes or {})
    wanted = {k: v for k, v in wanted.items() if v[0] != "float" and k in mods}
    num = {k: 0.0 for k in wanted}
    den = {k: 0.0 for k in wanted}
    qw = {k: fake_quant(mods[k].weight.detach().float(), *wanted[k]) for k in wanted}

    def hook(name: str) -> Any:
        def record(_m: Any, args: tuple[Any, ...], out: Any) -> None:
            x = args[0].detach().float()
            ref = x @ mods[name].weight.detach().float().T
            num[name] += float(((x @ qw[name].T - ref) ** 2).sum())
            den[name] += float((ref**2).sum())

        return record

    handles = [mods[k].register_forward_hook(hook(k)) for k in wanted]
    try:
        with torch.no_grad():
            for row in windows:
                model(torch.as_tensor(np.asarray(row, np.int64)[None]))
    finally:
        for h in handles:
            h.remove()
    return {k: float(np.sqrt(num[k] / den[k])) if den[k] > 0 else 0.0 for k in wanted}


def account(
    plan: list[LayerChoice],
    errors: dict[str, float] | None = None,
    *,
    headline: str | None = None,
    measured_on: str | None = None,
) -> dict[str, Any]:
    """The account a lineage step carries: every layer (what it became, why, its output error) and a summary:
    counts by scheme and the names that are not at the headline scheme (the variant's own, e.g. "int4 g32";
    default: the commonest among the linear layers), each with its reason."""
    errors = errors or {}
    layers = [
        {
            **{k: v for k, v in asdict(c).items() if v is not None},
            "shape": list(c.shape),
            "as": c.label(),
            **({"output_rel_error": round(errors[c.name], 6)} if c.name in errors else {}),
        }
        for c in plan
    ]
    counts: dict[str, int] = {}
    for c in plan:
        counts[c.label()] = counts.get(c.label(), 0) + 1
    headline = headline or max((c.label() for c in plan if c.kind == "linear"), key=lambda s: counts[s], default=None)
    return {
        "layers": layers,
        "counts": counts,
        "headline": headline,
        "not_headline": {c.name: f"{c.label()}: {c.reason}" for c in plan if c.label() != headline},
        "padded": {c.name: c.reason for c in plan if c.scheme == "int4" and c.reason},
        **({"errors_measured_on": measured_on} if measured_on else {}),
    }
