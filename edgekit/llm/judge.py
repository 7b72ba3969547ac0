"""The gate and the decision for language-model variants.

Gate options and their defaults, and why:

- ``max_kld`` (default 0.05 nats a token): between what llama.cpp's own KL measurements call good and lossy
  4-bit on Llama-3-8B (Q4_K_M 0.031, Q4_0 0.072; Q8_0 0.0014): the best 4-bit formats pass, the lossy ones do
  not, and 8-bit passes with a wide margin. Judged on the mean KLD's point value; the report gives its CI.
- ``max_perplexity_increase`` (default 0.05: 5% over the float model's perplexity on the same text): the
  order of Q4_K_M's increase on 7-8B models; tiny models lose more and are right to fail it.
- the KLD must be judgeable: the device returns log-probabilities at the float model's most likely tokens only,
  so the KLD is a lower bound that leaves out the float model's mass outside them. By default each position's
  tokens are sized to hold 99.5% of that mass (``quality.COVERAGE``), so on a trained model the bound is tight
  (a 15.5M Qwen2 trained here had only 85% inside a fixed top-256: every file, the baseline too, failed then).
  Where the mass left out still averages over ``MAX_TAIL_MASS`` (5%), only possible when a distribution is too
  flat for the transfer cap, the KLD is reported but not judged, and the other checks decide; with a fixed
  ``--top-k`` the check fails instead, asking for a larger K (on random-weight models the top-256 held 3% of
  the mass and the bound read 25-35x below the full KLD).
- degeneration can never pass: a variant whose greedy continuation repeats one token for more than half of
  its tokens where the float model's does not (``MAX_REPEAT_SHARE``), or whose KLD is more than 20x the bar.

The decision ships the fastest variant by the objective (decode tokens/s by default; ``ttft``: the warm time
to first token at the shortest prompt; ``prefill``: prefill tokens/s at the longest prompt) among those that
pass, and says why each other one lost. As for fixed graphs, a variant tied with the fastest on decode speed is
settled by the smaller file, by the project's one tie rule (``report/decision.py``: ``speed_tied``, the decode
95% CIs overlapping within its tolerance band, and ``settle_tie``): the device could not tell them apart, and
on a busy host the point estimates of tied files trade places from run to run (a user's GPT-2 shipped
ort-int4 on a quiet host and ort-int4-b128 on a busy one), while the smaller file is the same answer every time.
TTFT and prefill have no CI: the point estimate decides."""

from __future__ import annotations

from dataclasses import dataclass

from ..report.decision import TIE_TOLERANCE, busy_note, objective_cost, objective_tied, settle_tie
from ..report.model import Check, Decision, Gate, LMQuality, VariantResult
from .quality import COVERAGE

DEFAULT_MAX_KLD = 0.05
DEFAULT_MAX_PPL_INCREASE = 0.05
MAX_REPEAT_SHARE = 0.5
MAX_TAIL_MASS = 0.05
OBJECTIVES = ("decode", "ttft", "prefill")


@dataclass(frozen=True)
class LMGate:
    max_kld: float = DEFAULT_MAX_KLD
    max_perplexity_increase: float = DEFAULT_MAX_PPL_INCREASE
    max_memory_mb: float | None = None  # peak RSS budget (the target's limits or --memory-budget-mb)


def kld_check(v: VariantResult, q: LMQuality, cfg: LMGate) -> Check:
    """The KLD against the limit, when the scored tokens held enough of the float model's mass to judge it.

    By default each position's tokens are sized to hold ``quality.COVERAGE`` of the float mass, so the bound is
    tight; only a distribution too flat for the transfer cap leaves more than ``MAX_TAIL_MASS`` out, and then
    the KLD is not judged (reported, skipped, the perplexity and degeneration checks decide). A fixed
    ``--top-k`` that leaves it out fails instead: the user chose the loose bound, and a larger K fixes it."""
    tail = q.float_tail_mass_mean or 0.0
    loose = q.kld_bound == "lower" and tail > MAX_TAIL_MASS
    bound = f" (a lower bound: {tail:.1%} of the float mass outside the scored tokens)" if tail > 1e-6 else ""
    verdict = (
        f"mean KL divergence from the float model {q.kld_mean:.4g} nats/token (95% CI {_ci(q.kld_ci95)}) "
        f"vs limit {cfg.max_kld}{bound}"
    )
    passed, skipped, message = q.kld_mean <= cfg.max_kld, False, verdict
    if loose and q.coverage_target is not None:
        passed, skipped = True, True
        message = (
            f"KLD not judged: the float model's distribution is too flat on this text for the transfer "
            f"cap ({q.scored_ids} ids a variant, the flattest positions cut to {q.top_k_capped_at} tokens): the "
            f"scored tokens hold {1 - tail:.0%} of its mass, so {q.kld_mean:.4g} nats/token is only a lower "
            f"bound; the perplexity and degeneration checks decide (--top-k K scores K tokens everywhere)"
        )
    elif loose:
        passed = False
        message = (
            f"KLD not judgeable: the float model's top-{q.top_k} tokens hold only {1 - tail:.0%} of "
            f"its probability mass on this text, so {q.kld_mean:.4g} nats/token is a lower bound "
            f"that could hide a loss (drop --top-k: by default each position's tokens hold "
            f"{COVERAGE:.1%} of the mass; or a larger --top-k, up to the vocabulary)"
        )
    return Check(
        name="kld", variant=v.name, value=q.kld_mean, limit=cfg.max_kld, passed=passed, skipped=skipped, message=message
    )


def variant_checks(v: VariantResult, cfg: LMGate) -> list[Check]:
    q, g = v.quality, v.generation
    if q is None:
        return [Check(name="quality", variant=v.name, passed=False, message="no quality measured on the eval text")]
    # the baseline too: it is the float model on the device's runtime, compared with PyTorch's (never with itself)
    checks = [kld_check(v, q, cfg)]
    checks += [
        Check(
            name="perplexity_increase",
            variant=v.name,
            value=q.perplexity_increase,
            limit=cfg.max_perplexity_increase,
            passed=q.perplexity_increase <= cfg.max_perplexity_increase,
            message=f"perplexity {q.perplexity:.4g} vs float {q.perplexity_float:.4g}: "
            f"{q.perplexity_increase:+.2%} (95% CI {_ci(q.perplexity_increase_ci95, pct=True)}) "
            f"vs limit {cfg.max_perplexity_increase:+.0%}",
        ),
    ]
    rep = (q.greedy or {}).get("repeat_share")
    rep_f = (q.greedy or {}).get("repeat_share_float", 0.0) or 0.0
    collapsed = rep is not None and rep > MAX_REPEAT_SHARE and rep > rep_f + 0.25
    far = q.kld_mean > 20 * cfg.max_kld
    checks.append(
        Check(
            name="degenerate",
            variant=v.name,
            value=rep,
            limit=MAX_REPEAT_SHARE,
            passed=not (collapsed or far),
            message=(
                f"greedy output repeats one token for {rep:.0%} of its tokens (float model: {rep_f:.0%})"
                if collapsed
                else f"KLD {q.kld_mean:.3g} is over 20x the limit: the model's distribution is destroyed"
                if far
                else "generates like the float model (no collapse onto one token)"
            ),
        )
    )
    if cfg.max_memory_mb is not None and g is not None and g.peak_rss_mb is not None:
        checks.append(
            Check(
                name="memory_budget",
                variant=v.name,
                value=g.peak_rss_mb,
                limit=cfg.max_memory_mb,
                passed=g.peak_rss_mb <= cfg.max_memory_mb,
                message=f"peak RSS {g.peak_rss_mb:.0f} MB vs budget {cfg.max_memory_mb:.0f} MB",
            )
        )
    return checks


def _ci(ci: list[float] | None, pct: bool = False) -> str:
    if not ci:
        return "n/a"
    return f"[{ci[0]:+.2%}, {ci[1]:+.2%}]" if pct else f"[{ci[0]:.3g}, {ci[1]:.3g}]"


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
