"""The search's finals decided in alternating rounds (edgekit/variant_search/rounds.py) and the project's one tie
rule (edgekit/report/decision.py: speed_tied, settle_tie), issue #43: the leader and each close finalist take
turns in one agent process on the local device (real agent subprocess, real onnxruntime, tiny models), the paired
per-round ratio's 95% CI decides, and a tie ships the smaller file. The planted-load test runs the agent with a
runner whose every run gets slower as the process ages (drift_runner.py, through the agent's plug-in point): it
passes only because the rounds alternate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.artifact import Artifact
from edgekit.devices.session import DeviceSession, Measured, RunSettings
from edgekit.formats import Format
from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_source
from edgekit.inputs.targets import MeasureDefaults, load_target
from edgekit.metrics import MetricSpec
from edgekit.metrics.evaluate import eval_plan
from edgekit.report.decision import TIE_TOLERANCE, separate_runs_ratio, settle_tie, speed_tied
from edgekit.report.model import VariantResult
from edgekit.variant_search.rounds import ROUNDS, decide_in_rounds
from tests.unit.agent_loader import tiny_onnx

FAST = RunSettings(measure=MeasureDefaults(warmup=2, runs=10, min_seconds=0.0, max_runs=10))
DRIFT_RUNNER = Path(__file__).with_name("drift_runner.py")


def _padded(path: Path, n: int, pad_bytes: int) -> Path:
    """tiny_onnx's model with ``pad_bytes`` of metadata: the same graph (the same speed), a larger file."""
    tiny_onnx(path, n=n)
    m = onnx.load(str(path))
    m.metadata_props.add(key="padding", value="x" * pad_bytes)
    onnx.save(m, str(path))
    return path


@pytest.fixture
def session_of(tmp_path):
    """A local DeviceSession for tiny ONNX models of input [1, 64], and an artifact maker."""
    src_path = tiny_onnx(tmp_path / "src.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((8, 64)).astype(np.float32), y=rng.integers(0, 64, 8))
    src = load_source(src_path, workdir=tmp_path)
    ds = load_npz(tmp_path / "eval.npz", x_key="x", y_key="y", require_labels=False, role="eval")
    plan = eval_plan(MetricSpec(), src, ds)

    def art(name: str, pad: int = 0) -> Artifact:
        return Artifact.from_file(_padded(tmp_path / f"{name}.onnx", 64, pad), Format.ONNX, src.artifact.io)

    def session() -> DeviceSession:
        return DeviceSession(load_target("local"), None, source_io=src.artifact.io, plan=plan)

    return session, art


def _finalist(s: DeviceSession, name: str, art: Artifact, finals_p50: float | None = None) -> VariantResult:
    """``art`` measured as the finals do (separately); ``finals_p50``: the p50 (ms) those finals read instead,
    with a narrow CI, as a host whose load moved between them would have them read."""
    m = s.measure(name, art, FAST)
    assert isinstance(m, Measured), m
    v = m.result
    if finals_p50 is not None:
        assert v.latency_ms is not None
        v.latency_ms = v.latency_ms.model_copy(update={"p50": finals_p50, "ci95": [finals_p50 * 0.99,
                                                                                     finals_p50 * 1.01]})
    return v


def test_the_one_tie_rule_is_the_ci_overlap_widened_by_the_tolerance():
    # separate runs: the ratio's CI contains 1 exactly when the two CIs overlap
    assert separate_runs_ratio("a", 1.0, (0.9, 1.1), "b", 1.15, (1.05, 1.25)).ci95[0] < 1.0
    r = separate_runs_ratio("a", 1.0, (0.95, 1.05), "b", 1.5, (1.4, 1.6))
    assert not r.tied and r.slower and r.ratio == pytest.approx(1.5)
    # rates (tokens/s, higher is better) read as times
    assert separate_runs_ratio("a", 100.0, (98, 102), "b", 80.0, (78, 82), higher_is_better=True).slower
    # the paired CI: inside the band is a tie, beyond it is not
    assert speed_tied((1.01, 1.04)) and speed_tied((0.96, 0.99)) and speed_tied((1.04, 1.3))
    assert not speed_tied((1.0 + TIE_TOLERANCE * 1.2, 1.2)) and not speed_tied((0.8, 0.94))
    # the settlement: the smaller file, then the runtime's default options, then the name
    a, b, c = (VariantResult.model_construct(name=n, size_bytes=s) for n, s in (("b", 10), ("a@t2", 5), ("a", 5)))
    assert settle_tie([a, b, c]).name == "a"


def test_two_finalists_tied_in_alternating_rounds_ship_the_smaller_file(session_of):
    session, art = session_of
    big, small = art("big", pad=200_000), art("small")
    with session() as s:
        # the finals read the big file as faster (timed apart on a host whose load moved)
        qualified = [_finalist(s, "big", big, finals_p50=0.010), _finalist(s, "small", small, finals_p50=0.0108)]
        v = decide_in_rounds(s, qualified, {"big": big, "small": small}, FAST)
    assert v is not None and v.leader.name == "big"
    r = v.ratios["small"]
    assert r.how == f"{ROUNDS} alternating rounds" and r.tied, r
    assert v.ship.name == "small", (r, v.lost)
    assert "tied on speed with small" in v.lost["big"] and "alternating rounds" in v.lost["big"]
    assert "the smaller file" in v.note and "95% CI" in v.note


def test_a_clearly_faster_file_wins_the_rounds_even_when_larger(session_of, tmp_path):
    session, art = session_of
    fast = art("fast", pad=2_000_000)  # a 64x64 product, padded past the slow file's size
    slow_path = tmp_path / "slow.onnx"
    m = onnx.load(str(tiny_onnx(tmp_path / "slow-src.onnx", n=64)))
    # the same interface, 64 chained 64x64 products: ~64x the work, a smaller file than the padded one
    x = m.graph.node[0].input[0]
    w = m.graph.initializer[0]
    nodes = [onnx.helper.make_node("MatMul", [x if i == 0 else f"h{i}", "W"], [f"h{i + 1}" if i < 63 else "y"])
             for i in range(64)]
    g = onnx.helper.make_graph(nodes, "slow", list(m.graph.input), list(m.graph.output), [w])
    slow_m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    slow_m.ir_version = 8
    onnx.save(slow_m, str(slow_path))
    slow = Artifact.from_file(slow_path, Format.ONNX, fast.io)
    assert slow.size_bytes < fast.size_bytes
    with session() as s:
        # the finals read them as near (timed apart): the rounds decide
        qualified = [_finalist(s, "fast", fast, finals_p50=0.010), _finalist(s, "slow", slow, finals_p50=0.011)]
        v = decide_in_rounds(s, qualified, {"fast": fast, "slow": slow}, FAST)
    assert v is not None and v.ship.name == "fast"
    r = v.ratios["slow"]
    assert r.slower and r.ratio > 2 and r.how == f"{ROUNDS} alternating rounds", r
    assert v.lost["slow"].startswith("slower than fast: time ratio") and "tie band" in v.lost["slow"]


def test_a_load_that_grows_while_they_run_does_not_decide_because_the_rounds_alternate(session_of, monkeypatch):
    """The agent's runs get slower the longer its process lives (drift_runner.py): timed one after the other,
    the second file reads far slower than the first; in alternating rounds the two identical graphs read alike
    and the smaller file ships. Were the rounds not alternated (A's blocks, then B's; or A B, A B, ...: B always
    10% later), the smaller file, timed later, would read slower and the larger leader would ship (checked by
    changing the agent's order: this test then fails)."""
    session, art = session_of
    big, small = art("big", pad=200_000), art("small")
    with session() as s:
        qualified = [_finalist(s, "big", big, finals_p50=0.010), _finalist(s, "small", small, finals_p50=0.0105)]
        monkeypatch.setenv("EDGEKIT_AGENT_PLUGINS", str(DRIFT_RUNNER))
        blocks = s.measure_ab(big, small, FAST, ROUNDS)
        v = decide_in_rounds(s, qualified, {"big": big, "small": small}, FAST)
    # the load really grew: within each side, its last block is slower than its first
    med = [float(np.median(b)) for b in blocks.a]
    assert med[-1] > 1.3 * med[0], med
    assert v is not None and v.leader.name == "big"
    assert v.ratios["small"].tied, v.ratios["small"]
    assert v.ship.name == "small", v.lost
    assert "".join(blocks.order) == "ab" + "baab" * ((ROUNDS - 1) // 2) + ("ba" if ROUNDS % 2 == 0 else "")
