"""Two per-op profiles compared (``profile_diff``): per op type, nodes and time per inference in each, and one
sentence on what made a variant slower (or faster): the gate says it beside a latency failure, the report shows
it. Op types are grouped by family (``family``: Conv, FusedConv, QLinearConv... are Conv). The profiles themselves
come from the device (``devices/profile.py``)."""

from __future__ import annotations

from .model import OpProfile, OpTypeDelta, ProfileDiff, VariantResult

QDQ = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
QDQ_LABEL = "QuantizeLinear/DequantizeLinear"
# float compute op types (as onnxruntime runs them, fused ones included) -> their quantized forms
FLOAT_COMPUTE = {
    "Conv": "Conv",
    "FusedConv": "Conv",
    "NhwcFusedConv": "Conv",
    "Gemm": "Gemm",
    "FusedGemm": "Gemm",
    "MatMul": "MatMul",
    "FusedMatMul": "MatMul",
    "ConvTranspose": "ConvTranspose",
}
QUANT_COMPUTE = {
    "Conv": ("QLinearConv", "ConvInteger", "NhwcQLinearConv"),
    "Gemm": ("QGemm",),
    "MatMul": ("QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"),
    "ConvTranspose": ("QLinearConvTranspose",),
}
COMPUTE = ("Conv", "Gemm", "MatMul", "ConvTranspose")


def family(op_type: str | None) -> str:
    """Conv for Conv/FusedConv/QLinearConv/NhwcFusedConv/ConvInteger, Gemm for QGemm/FusedGemm..."""
    t = op_type or ""
    for prefix in ("Nhwc", "Fused", "QLinear", "Dynamic"):
        t = t[len(prefix) :] if t.startswith(prefix) else t
    return t[1:] if t in ("QGemm", "QAttention") else t.replace("Integer", "").replace("ToFloat", "")


def profile_diff(
    base: OpProfile, other: OpProfile, base_name: str, other_name: str, p50: tuple[float, float] | None = None
) -> ProfileDiff:
    """Per op type: nodes and time per inference in each, and one sentence on what made
    ``other_name`` slower (or faster) than ``base_name``. ``p50``: the two variants' measured p50s
    (base, other), said beside the profiler's figures (its per-node cost can outweigh a small model's
    real difference)."""
    if not base.available or not other.available:
        missing = [(n, p) for n, p in ((base_name, base), (other_name, other)) if not p.available]
        why = "; ".join(f"{n}: {p.reason}" for n, p in missing)
        return ProfileDiff(
            base=base_name,
            other=other_name,
            base_source=base.source,
            other_source=other.source,
            summary=f"no per-op diff of {other_name} vs {base_name}: no per-op profile for {why}",
        )
    same = base.source == other.source
    b = {t.op_type: t for t in base.by_op_type}
    o = {t.op_type: t for t in other.by_op_type}
    rows: list[OpTypeDelta] = []
    for k in dict.fromkeys([*b, *o]):
        bt, ot = b.get(k), o.get(k)
        bm, om = bt.ms if bt else 0.0, ot.ms if ot else 0.0
        rows.append(
            OpTypeDelta(
                op_type=k,
                base_nodes=bt.nodes if bt else 0,
                other_nodes=ot.nodes if ot else 0,
                base_ms=round(bm, 6),
                other_ms=round(om, 6),
                delta_ms=round(om - bm, 6),
            )
        )
    rows.sort(key=lambda r: -abs(r.delta_ms))
    delta = other.run_ms - base.run_ms
    summary = _summary(base, other, base_name, other_name, rows, delta, same, p50)
    return ProfileDiff(
        base=base_name,
        other=other_name,
        base_source=base.source,
        other_source=other.source,
        same_runtime=same,
        delta_ms=round(delta, 6),
        rows=rows,
        summary=summary,
    )


def _groups(rows: list[OpTypeDelta]) -> list[tuple[str, float]]:
    """(label, delta ms) per group of op types: Q and DQ together, and each compute family together
    (Conv, FusedConv, QLinearConv...), so a replaced kernel is one line: "3 QLinearConv in place of
    3 Conv add 0.01 ms"."""
    out: dict[str, list[OpTypeDelta]] = {}
    for r in rows:
        key = QDQ_LABEL if r.op_type in QDQ else (family(r.op_type) if family(r.op_type) in COMPUTE else r.op_type)
        out.setdefault(key, []).append(r)
    groups: list[tuple[str, float]] = []
    for key, rs in out.items():
        d = sum(r.delta_ms for r in rs)
        added = sum(r.other_nodes for r in rs) - sum(r.base_nodes for r in rs)
        now = [f"{r.other_nodes} {r.op_type}" for r in rs if r.other_nodes > r.base_nodes]
        was = [f"{r.base_nodes} {r.op_type}" for r in rs if r.base_nodes > r.other_nodes]
        if key == QDQ_LABEL:
            label = f"{added} {QDQ_LABEL}" if added > 0 else QDQ_LABEL
        elif now and was:
            label = f"{' + '.join(now)} in place of {' + '.join(was)}"
        elif now:
            label = f"{' + '.join(now)} (new)" if all(r.base_nodes == 0 for r in rs) else f"{key} ({' + '.join(now)})"
        else:
            label = key
        groups.append((label, d))
    return groups


def _summary(
    base: OpProfile,
    other: OpProfile,
    base_name: str,
    other_name: str,
    rows: list[OpTypeDelta],
    delta: float,
    same: bool,
    p50: tuple[float, float] | None = None,
) -> str:
    slower = delta > 0
    head = (
        f"{other_name} is {abs(delta):.3g} ms {'slower' if slower else 'faster'} than {base_name} under the "
        f"profiler (median run {other.run_ms:.3g} vs {base.run_ms:.3g} ms"
    )
    if p50 is not None:
        head += f"; measured p50 {p50[1]:.3g} vs {p50[0]:.3g} ms"
        if (p50[1] > p50[0]) != slower:
            head += (
                f"; the profiler's own cost per node ({len(other.ops)} vs {len(base.ops)} nodes) outweighs "
                "the measured difference"
            )
    head += ")"
    if not same:
        head += f" (different runtimes, {other.source} vs {base.source}: compared by op type only)"
    groups = sorted(_groups(rows), key=lambda g: -g[1] if slower else g[1])
    floor = max(abs(delta) * 0.05, 1e-4)
    parts = [
        f"{label} {'add' if slower else 'save'} {abs(d):.3g} ms"
        for label, d in groups[:3]
        if ((d > floor) if slower else (d < -floor))
    ]
    if not parts:
        parts.append("no op type accounts for it (within the ops' spread)")
    stays = _stays_float(other) if same else []
    return head + ": " + ", ".join(parts) + ("; " + "; ".join(stays) if stays else "")


def _stays_float(p: OpProfile) -> list[str]:
    """In a quantized model (it runs Q/DQ or integer kernels), the float compute ops left."""
    types = {t.op_type: t.nodes for t in p.by_op_type}
    quantized = any(t in types for t in QDQ) or any(q in types for qs in QUANT_COMPUTE.values() for q in qs)
    if not quantized:
        return []
    out: list[str] = []
    for fam in dict.fromkeys(FLOAT_COMPUTE.values()):
        fl = sum(n for t, n in types.items() if FLOAT_COMPUTE.get(t) == fam)
        if fl:
            q = QUANT_COMPUTE[fam][0]
            nq = sum(types.get(t, 0) for t in QUANT_COMPUTE[fam])
            out.append(f"{fam} stays fp32 in {fl} place{'s' if fl != 1 else ''} ({fl} {fam} vs {nq} {q})")
    return out


def is_slower(v: VariantResult, base: VariantResult | None) -> bool:
    """Whether variant ``v`` is slower than ``base`` on the device: their p50 95% CIs separated (the
    variant's lower bound above the baseline's upper bound). Both are report VariantResults."""
    if v is base or v.latency_ms is None or base is None or base.latency_ms is None:
        return False
    return bool(v.latency_ms.ci95[0] > base.latency_ms.ci95[1])


def profile_diffs(variants: list[VariantResult], baseline: str) -> list[ProfileDiff]:
    """The baseline's profile against every other profiled variant's (report VariantResults)."""
    base = next((v for v in variants if v.name == baseline), None)
    if base is None or base.op_profile is None:
        return []
    base_profile = base.op_profile
    return [
        profile_diff(base_profile, v.op_profile, baseline, v.name, measured_p50s(base, v))
        for v in variants
        if v is not base and v.op_profile is not None
    ]


def measured_p50s(base: VariantResult, v: VariantResult) -> tuple[float, float] | None:
    if base.latency_ms is None or v.latency_ms is None:
        return None
    return base.latency_ms.p50, v.latency_ms.p50
