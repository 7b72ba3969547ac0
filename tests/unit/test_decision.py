"""What a deploy says to ship (edgekit/report/decision.py): the fastest variant inside the gate,
ties settled by the smaller file, and a reason for every variant that lost."""

from __future__ import annotations

from edgekit.inputs.recipe import GateConfig
from edgekit.report.decision import decide
from tests.unit.report_factory import variant


def test_a_faster_variant_inside_the_tolerance_ships_and_is_proved_faster():
    fp32 = variant("fp32", median=1.0, seed=1)
    int8 = variant("int8", median=0.5, precision="int8", size=60_000, seed=2, acc=97.8)
    d = decide([fp32, int8], "fp32", GateConfig())
    assert d.ship == "int8" and d.proved_faster and "faster than fp32 on the device" in d.reason
    assert "slower than int8" in d.lost["fp32"]


def test_a_slower_compressed_variant_loses_and_the_baseline_ships():
    fp32 = variant("fp32", median=1.0, seed=1)
    int8 = variant("int8", median=1.3, precision="int8", size=60_000, seed=2)
    d = decide([fp32, int8], "fp32", GateConfig())
    assert d.ship == "fp32" and not d.proved_faster
    assert d.lost["int8"].startswith("slower than fp32") and "CIs separated" in d.lost["int8"]


def test_outside_the_tolerance_loses_with_the_check_that_failed_even_when_fastest():
    fp32 = variant("fp32", median=1.0, seed=1)
    bad = variant("int8", median=0.3, precision="int8", size=60_000, seed=2, acc=80.0)
    d = decide([fp32, bad], "fp32", GateConfig(max_accuracy_drop=1.0))
    assert d.ship == "fp32" and "accuracy_drop" in d.lost["int8"]


def test_a_tie_on_speed_ships_the_smaller_file_and_says_it_is_not_proved_faster():
    fp32 = variant("fp32", median=1.0, seed=1)
    int8 = variant("int8", median=1.0, precision="int8", size=60_000, seed=1)  # same timings
    d = decide([fp32, int8], "fp32", GateConfig())
    assert d.ship == "int8" and not d.proved_faster and "not proved faster" in d.reason
    assert "tied with int8" in d.lost["fp32"]


def test_nothing_ships_when_nothing_meets_the_budgets():
    fp32 = variant("fp32", median=1.0, seed=1, mem=80.0)
    int8 = variant("int8", median=0.5, precision="int8", size=60_000, seed=2, mem=70.0)
    d = decide([fp32, int8], "fp32", GateConfig(peak_memory_mb=10))
    assert d.ship is None and set(d.lost) == {"fp32", "int8"}
    assert all("peak_memory_budget" in why for why in d.lost.values())


def test_a_baseline_without_a_latency_gives_a_reason_not_a_crash():
    """ship_decision (the search's words for its choice) with a baseline the device could not time: the
    shipped file is not claimed faster, and the reason names which side was not measured (it raised
    AttributeError on None.p50 before the report's types were checked)."""
    from edgekit.report.decision import ship_decision

    fp32 = variant("fp32", median=1.0, seed=1).model_copy(update={"latency_ms": None})
    int8 = variant("int8", median=0.5, precision="int8", size=60_000, seed=2)
    d = ship_decision(int8, fp32, {})
    assert d.ship == "int8" and not d.proved_faster
    assert "latency not measured on fp32" in d.reason
