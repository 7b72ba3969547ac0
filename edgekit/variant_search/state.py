"""A search's settings (``SearchOptions``, what the caller asks) and its state as it goes (``SearchState``, what
each stage found, which the report is made from)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..agent.host import HostThreads
from ..devices.session import Measured, RunSettings
from ..inputs.recipe import VariantSpec
from ..inputs.targets import MeasureDefaults
from ..orchestration.options import DeployOptions
from ..orchestration.prepare import PreparedRun
from ..report.model import Gate, VariantResult
from ..report.release import ReleaseJudgement
from ..timeline import Clock
from .choice import Candidate, Objective
from .goal import BudgetGoal
from .rounds import CLOSE, RoundsVerdict


@dataclass
class SearchOptions:
    objective: Objective = "p50"
    # wall time: builds start only inside the first BUILD_SHARE of it, and a candidate that was built is
    # always measured (a short search on a slow machine must not spend its budget on builds it then
    # throws away, shipping fp32 unmeasured against them); runtime tuning stops at it. Candidates not
    # built are dropped with that reason.
    time_budget_s: float = 900.0
    screening_runs: int = 30
    # screening's racing drops a candidate only when its CI lies more than this above the best's: the finals time
    # every closer one against the leader in alternating rounds (rounds.CLOSE). Screening runs are short and
    # taken one after another: on a 2-core host they read the digits demo's tflite-int8 31% slower than
    # tflite-dynamic, where alternating rounds read the two within 4% (issue #43): at 5%, racing dropped int8
    race_margin: float = CLOSE
    host_filter: bool = True
    host_slack: float = 0.5  # accuracy points of leeway for host-vs-device differences
    candidates: list[VariantSpec] | None = None  # None = every candidate the target can run
    remeasure: bool = False  # kept for callers; the same as DeployOptions.remeasure
    measure: MeasureDefaults | None = None  # final measurement settings (None = the target's with the options')
    # runtime options as a search dimension: the selected variant is measured again under the
    # runtime's options (threads 1..cores unless --threads fixes them, and each runtime's own:
    # variant_search/tuning.py RUNTIME_OPTIONS) and the fastest setting ships, with the options it
    # needs beside the file
    tune_runtime: bool = True
    # only the target's likeliest winners (the registry's ``quick`` candidates): what `edgekit deploy`
    # runs without a recipe; --search tries every candidate
    quick: bool = False


@dataclass
class SearchState:
    """One search as it goes: its prepared run and settings, then what each stage found (``_report`` reads it)."""

    run: PreparedRun
    sopts: SearchOptions
    opts: DeployOptions
    clock: Clock
    ht: HostThreads
    progress: Callable[[str], None]
    cands: list[Candidate] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (candidate, why the target skips it)
    final: dict[str, Measured] = field(default_factory=dict)  # the finalists' full measurements, by name
    chosen: VariantResult | None = None  # what ships (None: nothing passes)
    nogate: Gate | None = None  # the gate's verdict when nothing qualified
    kept: dict[str, Any] | None = None  # the release's choice kept within its latency tolerance
    rounds: RoundsVerdict | None = None  # the finals' alternating rounds (p50): what they decided and why
    release: ReleaseJudgement | None = None
    base_screen: VariantResult | None = None  # the baseline's screening measurement
    screen_settings: RunSettings | None = None
    final_settings: RunSettings | None = None
    budget: BudgetGoal | None = None  # a latency budget as a goal (budget.py): its record goes to the report
