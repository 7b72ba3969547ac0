""".ci/run: its header, its budget table and its steps agree (#43: one source for every fact): every step has a
budget and every budget a step, the sum the comment quotes is the table's, and the target is the product's 45
minutes."""

from __future__ import annotations

import re
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


def _run() -> str:
    return RUN.read_text(encoding="utf-8")


def budgets() -> dict[str, int]:
    table = re.search(r"^declare -A BUDGET=\((.*)\)$", _run(), flags=re.M)
    assert table, "no BUDGET table in .ci/run"
    return {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", table.group(1))}


def test_every_step_has_a_budget_and_every_budget_a_step():
    steps = re.findall(r"^step (\S+) ", _run(), flags=re.M)
    assert len(steps) == len(set(steps)) >= 8
    assert set(budgets()) == set(steps)


def test_the_header_quotes_the_target_and_the_budgets_sum():
    text = _run()
    target = re.search(r"^TARGET_S=(\d+)$", text, flags=re.M)
    assert target and int(target.group(1)) == 45 * 60
    assert "the whole run in 45 minutes (TARGET_S)" in text
    total = sum(budgets().values())
    quoted = re.search(r"The budgets sum to more than the target \((\d+) s, (\d+) min\)", text)
    # when the budgets come to fit the target, this sentence (and this test) change with them
    assert quoted and total > int(target.group(1)), "the budgets fit the target now: say so in .ci/run"
    assert int(quoted.group(1)) == total and int(quoted.group(2)) == round(total / 60)
    # the steps it names as dominating, with the table's figures
    table = budgets()
    both = r"install and ExecuTorch \((\d+) each"
    for step, pattern in [("slow", r"the slow step \((\d+) s"), ("llamacpp", r"llama\.cpp \((\d+)\)"),
                          ("default", r"the default suite \((\d+),"), ("install", both), ("executorch", both)]:
        m = re.search(pattern, text)
        assert m and int(m.group(1)) == table[step], step
