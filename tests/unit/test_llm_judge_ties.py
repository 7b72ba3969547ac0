"""The language-model decision's tie rule (edgekit/llm/judge.py): among the files inside the quality gate, one
whose decode 95% CI overlaps the fastest's is a tie, settled by the smaller file, as the fixed-graph decision
does; a file proved slower (CIs separated) loses as slower; TTFT has no CI and is decided by the point estimate.
Built from report models, no deploy."""

from __future__ import annotations

from edgekit.llm.judge import LMGate, judge
from edgekit.report.model import VariantResult


def _v(name: str, *, tok_s: float, ci: list[float], size: int, ttft: float = 1.0) -> VariantResult:
    return VariantResult(
        name=name, format="onnx", precision="int4", size_bytes=size,
        runtime={"name": "onnxruntime", "version": "1.32.0", "threads": 1}, sha256=(name.encode().hex() * 64)[:64],
        generation={"context": 96, "ttft_ms": ttft, "prefill": [{"tokens": 6, "tokens_per_s": 1000.0}],
                    "decode_tokens_per_s": tok_s, "decode_tokens_per_s_ci95": ci},
        quality={"positions": 270, "windows": 6, "top_k": 64, "perplexity": 21.2, "perplexity_float": 21.13,
                 "perplexity_increase": 21.2 / 21.13 - 1, "kld_mean": 0.01, "kld_ci95": [0.008, 0.012],
                 "top1_agreement": 0.96, "greedy": {"repeat_share": 0.1, "repeat_share_float": 0.1}})


def _race() -> list[VariantResult]:
    return [_v("ort-fp32", tok_s=50.0, ci=[49.0, 51.0], size=4_000_000, ttft=2.0),
            _v("ort-int4", tok_s=101.0, ci=[98.0, 104.0], size=1_200_000, ttft=0.9),  # fastest point estimate
            _v("ort-int4-b128", tok_s=99.0, ci=[96.0, 102.0], size=1_000_000, ttft=1.1),  # tied, smaller
            _v("gguf-q4_0", tok_s=80.0, ci=[78.0, 82.0], size=900_000, ttft=1.0)]  # smallest, proved slower


def test_a_tie_on_decode_ships_the_smaller_file_and_says_so():
    gate, d = judge(_race(), "ort-fp32", LMGate(), "decode", {})
    assert gate.passed and d.ship == "ort-int4-b128", d
    assert "tied on speed with the fastest, ort-int4" in d.reason and "smaller file (1.0 MB vs 1.2 MB)" in d.reason
    assert d.lost["ort-int4"].startswith("tied with ort-int4-b128 on speed") and "larger" in d.lost["ort-int4"]
    # proved slower than the fastest: loses as slower even though it is the smallest file
    assert d.lost["gguf-q4_0"].startswith("slower:") and "ort-int4's" in d.lost["gguf-q4_0"]
    assert d.proved_faster  # b128's CI lies above fp32's


def test_the_answer_does_not_depend_on_which_tied_file_read_faster():
    """The busy-host case: the tied files' point estimates trade places; the shipped file stays the same."""
    race = _race()
    race[1], race[2] = (_v("ort-int4", tok_s=97.0, ci=[94.0, 100.0], size=1_200_000),
                        _v("ort-int4-b128", tok_s=103.0, ci=[100.0, 106.0], size=1_000_000))
    _, d = judge(race, "ort-fp32", LMGate(), "decode", {})
    assert d.ship == "ort-int4-b128" and d.reason.startswith("ort-int4-b128: fastest inside the quality gate")
    assert d.lost["ort-int4"].startswith("tied with ort-int4-b128")


def test_separated_cis_ship_the_fastest_even_when_larger():
    race = _race()
    race[2] = _v("ort-int4-b128", tok_s=90.0, ci=[89.0, 91.0], size=1_000_000)
    _, d = judge(race, "ort-fp32", LMGate(), "decode", {})
    assert d.ship == "ort-int4" and d.lost["ort-int4-b128"].startswith("slower:")


def test_ttft_has_no_ci_so_the_point_estimate_decides():
    _, d = judge(_race(), "ort-fp32", LMGate(), "ttft", {})
    assert d.ship == "ort-int4" and d.lost["ort-int4-b128"].startswith("slower:")


def test_a_decode_speed_measured_on_a_busy_device_says_so():
    """As for fixed graphs: the agent reads the other processes' CPU share during each run; the answer says when
    the shipped file or the baseline was measured under contention (a user's GPT-2 on a loaded host shipped with
    no word of it)."""
    race = _race()
    _, quiet = judge(race, "ort-fp32", LMGate(), "decode", {})
    assert "busy device" not in quiet.reason
    for v, share in zip(race, (0.62, 0.05, 0.65, 0.9)):
        v.device_state = {"other_cpu_fraction": share}
    _, busy = judge(race, "ort-fp32", LMGate(), "decode", {})
    assert busy.ship == "ort-int4-b128"
    assert "measured on a busy device: other processes used ort-int4-b128 65%, ort-fp32 62% of its CPU" in busy.reason
    assert "gguf-q4_0" not in busy.reason  # only the shipped file and the baseline the ratio is against


def test_one_objective_ranks_fixed_graphs_and_generators_alike():
    """report/decision.objective_cost is every decision's objective (lower is better): a generator's decode rate
    as time a token, its prefill rate likewise, its TTFT as is; a fixed graph's p50 and size."""
    from edgekit.report.decision import objective_cost, objective_tied
    from tests.unit.report_factory import variant

    fast, slow = _v("a", tok_s=200.0, ci=[190.0, 210.0], size=1, ttft=3.0), _v("b", tok_s=100.0, ci=[95.0, 105.0],
                                                                              size=1, ttft=1.0)
    assert objective_cost(fast, "decode") == 5.0 and objective_cost(slow, "decode") == 10.0
    assert objective_cost(fast, "prefill") == 1.0 and objective_cost(fast, "ttft") == 3.0
    assert not objective_tied(fast, slow, "decode")  # 2x apart: CIs far beyond the tie band
    assert objective_tied(slow, _v("c", tok_s=102.0, ci=[97.0, 107.0], size=1), "decode")
    assert not objective_tied(slow, _v("c", tok_s=102.0, ci=[97.0, 107.0], size=1), "ttft")  # no CI: never a tie
    fp32 = variant("fp32", median=1.0, seed=1)
    assert objective_cost(fp32, "p50") == fp32.latency_ms.p50 and objective_cost(fp32, "size") == fp32.size_bytes
    assert objective_cost(fp32, "decode") is None and objective_cost(fast, "p50") is None  # not measured: None


def test_one_gate_judges_a_generator_and_a_fixed_graph():
    """The language model's gate is the one gate (report/gate.variant_checks with GateConfig): a generated file is
    judged on its quality, not on an accuracy drop, and the memory and size budgets are the fixed graph's checks."""
    from edgekit.inputs.recipe import GateConfig
    from edgekit.report.gate import evaluate_gate

    race = _race()
    race[1].peak_memory_mb = 300.0
    race[1].quality.kld_mean = 0.09  # over the default 0.05
    gate = evaluate_gate(race, "ort-fp32", GateConfig(peak_memory_mb=256.0, model_size_mb=1.1),
                         judged=["ort-int4"])
    failed = {c.name for c in gate.checks if not c.passed}
    assert failed == {"kld", "peak_memory_budget", "model_size_budget"}, [c.message for c in gate.checks]
    assert "accuracy_drop" not in {c.name for c in gate.checks}
    assert {c.name for c in gate.checks} >= {"kld", "perplexity_increase", "degenerate"}
    # the LM judge reads the same checks: the same limits give the same verdict
    for v in race[2:]:
        v.peak_memory_mb = 200.0
    lm_gate, d = judge(race, "ort-fp32", LMGate(peak_memory_mb=256.0, max_kld=0.1), "decode", {})
    assert d.ship == "ort-int4-b128" and lm_gate.passed
    assert "peak_memory_budget" in d.lost["ort-int4"] and "not measured" in d.lost["ort-fp32"]
    assert LMGate is GateConfig
