"""A recipe of several compressed variants is a race, as the search is (issue #46 item 7): the gate judges the
file the decision ships, and a variant that misses the tolerance loses with its reason, so the exit code, the
first line and the answer agree. A recipe of one compressed variant still judges that one."""

from __future__ import annotations

import json

import pytest

from edgekit.report.model import Report

FAST = ("--runs", "20", "--min-seconds", "0.1", "--warmup", "2")


@pytest.mark.slow
def test_a_variant_that_misses_loses_with_its_reason_and_the_gate_judges_what_ships(cli, digits, tmp_path):
    recipe = tmp_path / "race.yaml"
    recipe.write_text("baseline: fp32\nvariants:\n"
                      "  - name: dyn\n    passes:\n      - quantize: {mode: dynamic}\n"
                      "  - name: pruned95\n    passes:\n      - prune_magnitude: {sparsity: 0.95}\n")
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--recipe", recipe, "--out", tmp_path / "o", *FAST)
    rep = Report.load(tmp_path / "o" / "report.json")
    assert rep.variant("pruned95").accuracy_drop > 50  # 95% of the weights zeroed: it misses by far
    ship = rep.decision.ship
    assert ship in ("fp32", "dyn")
    assert rep.decision.lost["pruned95"].startswith("fails accuracy_drop")
    # the exit code, the gate and the first line agree with the answer: something ships inside the gate
    assert r.exit_code == 0, r.stdout + r.stderr
    judged = {c.variant for c in rep.gate.checks if c.variant and not c.name.startswith("parity")}  # parity: every hop
    assert rep.gate.passed and judged <= {ship}
    assert r.stdout.splitlines()[0].startswith("gate PASSED")
    assert json.loads((tmp_path / "o" / "ship" / "ship.json").read_text())["variant"] == ship


@pytest.mark.slow
def test_a_recipe_of_one_compressed_variant_still_judges_it(cli, digits, tmp_path):
    recipe = tmp_path / "one.yaml"
    recipe.write_text("baseline: fp32\nvariants:\n  - name: pruned95\n    passes:\n"
                      "      - prune_magnitude: {sparsity: 0.95}\n")
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--recipe", recipe, "--out", tmp_path / "o", *FAST)
    assert r.exit_code == 1
    rep = Report.load(tmp_path / "o" / "report.json")
    assert any(c.name == "accuracy_drop" and c.variant == "pruned95" and not c.passed for c in rep.gate.checks)
