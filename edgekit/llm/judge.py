"""The gate and the decision for language-model variants.

The gate is the one gate of every kind of model (``report/gate.variant_checks``, ``GateConfig``'s ``max_kld`` and
``max_perplexity_increase``; the defaults and why are said there).

The decision ships the fastest variant by the objective (decode tokens/s by default; ``ttft``: the warm time
to first token at the shortest prompt; ``prefill``: prefill tokens/s at the longest prompt) among those that
pass, and says why each other one lost. As for fixed graphs, a variant tied with the fastest on decode speed is
settled by the smaller file, by the project's one tie rule (``report/decision.py``: ``speed_tied``, the decode
95% CIs overlapping within its tolerance band, and ``settle_tie``): the device could not tell them apart, and
on a busy host the point estimates of tied files trade places from run to run (a user's GPT-2 shipped
ort-int4 on a quiet host and ort-int4-b128 on a busy one), while the smaller file is the same answer every time.
TTFT and prefill have no CI: the point estimate decides."""

from __future__ import annotations

from ..inputs.recipe import GateConfig
from ..report.decision import TIE_TOLERANCE, busy_note, objective_cost, objective_tied, settle_tie
from ..report.gate import DEFAULT_MAX_KLD, DEFAULT_MAX_PPL_INCREASE, MAX_REPEAT_SHARE, MAX_TAIL_MASS, kld_check
from ..report.gate import variant_checks as gate_checks
from ..report.model import Check, Decision, Gate, VariantResult

__all__ = [
    "DEFAULT_MAX_KLD",
    "DEFAULT_MAX_PPL_INCREASE",
    "MAX_REPEAT_SHARE",
    "MAX_TAIL_MASS",
    "LMGate",
    "judge",
    "kld_check",
    "variant_checks",
]

OBJECTIVES = ("decode", "ttft", "prefill")


# a generator's gate is the one gate (its quality limits and memory budget are GateConfig's fields); the name stays
# for the Python API
LMGate = GateConfig


def variant_checks(v: VariantResult, cfg: GateConfig) -> list[Check]:
    """The gate's checks of one generated variant (``report/gate.variant_checks`` as a generator)."""
    return gate_checks(v, cfg, generation=True)


_TIE_WHY = f"the ratio's 95% CI reaches within {TIE_TOLERANCE:.0%} of even"


def _mb(v: VariantResult) -> str:
    return f"{v.size_bytes / 1e6:.1f} MB" if v.size_bytes >= 1e6 else f"{v.size_bytes / 1e3:.0f} KB"


def describe(v: VariantResult, objective: str) -> str:
    g = v.generation
    assert g is not None
    if objective == "decode":
        lo, hi = g.decode_tokens_per_s_ci95 or [float("nan")] * 2
        return f"decode {g.decode_tokens_per_s:.1f} tok/s (95% CI {lo:.1f}-{hi:.1f})"
    if objective == "ttft":
        return f"TTFT {g.ttft_ms:.2f} ms at {g.prefill[0]['tokens']} tokens"
    return f"prefill {g.prefill[-1]['tokens_per_s']:.0f} tok/s at {g.prefill[-1]['tokens']} tokens"


def judge(
    variants: list[VariantResult], baseline: str, cfg: LMGate, objective: str, dropped: dict[str, str]
) -> tuple[Gate, Decision]:
    """The gate over the shipped variant and the decision among all (``dropped``: variants that never reached a
    measurement, with their reasons)."""
    lost = dict(dropped)
    ok = []
    for v in variants:
        failed = [c for c in variant_checks(v, cfg) if not c.passed]
        if failed:
            lost[v.name] = "fails " + "; ".join(f"{c.name}: {c.message}" for c in failed)
        elif objective_cost(v, objective) is None:
            lost[v.name] = f"no {objective} figure measured"
        else:
            ok.append(v)
    if not ok:
        gate = Gate(
            passed=False,
            checks=[c for v in variants for c in variant_checks(v, cfg)]
            or [Check(name="measured", passed=False, message="no variant was measured")],
        )
        return gate, Decision(ship=None, reason="no variant passes the quality checks", lost=lost)
    # the one objective and tie rule (report/decision.py): the least time by the objective; a decode rate tied
    # with the fastest's by the tokens/s CIs is settled by the smaller file (TTFT and prefill have no CI here)
    fastest = min(ok, key=lambda v: (objective_cost(v, objective) or 0.0, v.size_bytes))
    ties = [v for v in ok if v is fastest or objective_tied(fastest, v, objective)]
    best = settle_tie(ties)  # the one tie settlement: the smaller file
    for v in ok:
        if v is best:
            continue
        if v in ties:
            lost[v.name] = (
                f"tied with {best.name} on speed ({describe(v, objective)} vs {describe(best, objective)}: "
                f"{_TIE_WHY}) and larger ({_mb(v)} vs {_mb(best)})"
            )
        else:
            lost[v.name] = f"slower: {describe(v, objective)} vs {fastest.name}'s {describe(fastest, objective)}"
    base = next((v for v in variants if v.name == baseline), None)
    reason = (
        f"{best.name}: fastest inside the quality gate ({describe(best, objective)})"
        if best is fastest
        else f"{best.name}: inside the quality gate, tied on speed with the fastest, {fastest.name} "
        f"({describe(best, objective)} vs {describe(fastest, objective)}: {_TIE_WHY}), and the "
        f"smaller file ({_mb(best)} vs {_mb(fastest)})"
    )
    faster = False
    if base is not None and base is not best and base.generation and best.generation and objective == "decode":
        b_hi = (base.generation.decode_tokens_per_s_ci95 or [0, 0])[1]
        s_lo = (best.generation.decode_tokens_per_s_ci95 or [0, 0])[0]
        ratio = (best.generation.decode_tokens_per_s or 0) / (base.generation.decode_tokens_per_s or 1)
        faster = s_lo > b_hi
        reason += f"; {ratio:.2f}x {baseline}'s decode speed" + (
            " (95% CIs separated)" if faster else " (not proved faster: the 95% CIs overlap)"
        )
    # a decode speed measured while other processes took the CPU is said to be so, as for fixed graphs
    reason += busy_note(best, *([base] if base is not None and base is not best else []))
    for v in variants:
        v.selected = v is best
    gate = Gate(passed=True, checks=variant_checks(best, cfg))
    gate.passed = all(c.passed for c in gate.checks)
    return gate, Decision(ship=best.name, reason=reason, proved_faster=faster, lost=lost)
