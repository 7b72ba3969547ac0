"""Issue #11 on a simulated SSH device: the search measures on the device it is given (real sshd),
never ships a candidate outside the tolerance, and the choice is reproducible."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from sshd import needs_sshd, register, sshd_server  # noqa: E402,F401  (pytest fixture)

from edgekit.recipe import PassStep, VariantSpec  # noqa: E402
from edgekit.targets import MeasureDefaults  # noqa: E402
from edgekit.variant_search import SearchOptions, search  # noqa: E402

pytestmark = [needs_sshd, pytest.mark.slow]


@pytest.fixture
def board(sshd_server, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    register(sshd_server, "board", target="local", workdir=tmp_path / "device")
    return sshd_server


def test_search_over_ssh_picks_a_variant_inside_the_tolerance(digits, board, tmp_path):
    from edgekit.passes.registry import register as register_pass

    register_pass("fast_but_wrong", "test_search:FastButWrong")
    cands = [VariantSpec(name="wrong-but-fast", passes=[PassStep(name="fast_but_wrong")]),
             VariantSpec(name="int8", passes=[PassStep(name="quantize", config={"mode": "static"})]),
             VariantSpec(name="int8-dyn", passes=[PassStep(name="quantize", config={"mode": "dynamic"})])]
    opts = SearchOptions(candidates=cands, host_filter=False, screening_runs=20,
                         measure=MeasureDefaults(warmup=2, runs=60, min_seconds=0.0, max_runs=60))
    runs = [search(digits.pt2, eval_data=digits.eval, calib_data=digits.calib, target="local", device="board",
                   out=tmp_path / f"out{i}", options=opts) for i in range(2)]
    for rep in runs:
        assert rep.device["transport"] == "ssh" and rep.device["name"] == "board"
        assert rep.search["selected"] not in (None, "wrong-but-fast")
        wrong = next(c for c in rep.search["candidates"] if c["name"] == "wrong-but-fast")
        assert wrong["status"] == "dropped" and wrong["dropped_at"] == "screening"
        chosen = next(v for v in rep.variants if v.selected)
        ok = [v for v in rep.variants if v.accuracy_drop is not None and v.accuracy_drop <= 1.0]
        assert chosen.latency_ms.p50 <= 1.10 * min(v.latency_ms.p50 for v in ok) or \
            chosen.latency_ms.ci95[0] <= min(v.latency_ms.p50 for v in ok)
