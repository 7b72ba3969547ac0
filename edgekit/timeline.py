"""The run's clock: a time budget that bounds the wall clock, and a timeline of where the time went.

One :class:`Clock` is handed down a search (preparation, each build, lock wait, screening, finals,
tuning, profile, report). Each stage opens a ``span``; the report's timeline is those spans and the
console's progress reads the same clock. Waiting for the device's lock is a span of its own that does
not eat the budget (``--lock-timeout`` bounds it). Long builds check the deadline cooperatively
(``check_deadline``, between trials, epochs and steps): a build past its deadline raises
:class:`BudgetExceeded` and the search drops that candidate with its elapsed time.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .errors import EdgekitError


class BudgetExceeded(EdgekitError):
    """A build ran past the time budget's deadline (the search drops that candidate)."""

    exit_code = 2


@dataclass
class Span:
    stage: str  # preparation | build | lock_wait | delivery | screening | finals | tuning | release | profile | report
    name: str | None
    start: float  # seconds since the clock started
    end: float | None = None
    note: str | None = None

    @property
    def seconds(self) -> float:
        return (self.end if self.end is not None else 0.0) - self.start

    def to_dict(self) -> dict:
        return {"stage": self.stage, "name": self.name, "start_s": round(self.start, 3),
                "seconds": round(self.seconds, 3), **({"note": self.note} if self.note else {})}


@dataclass
class Clock:
    """``budget_s`` = None: no budget (spans are still recorded). Times are ``time.perf_counter``."""

    budget_s: float | None = None
    started: float = field(default_factory=time.perf_counter)
    started_unix: float = field(default_factory=time.time)
    spans: list[Span] = field(default_factory=list)
    excluded_s: float = 0.0  # time that does not count against the budget (the lock wait)

    def now(self) -> float:
        return time.perf_counter() - self.started

    @property
    def deadline(self) -> float:
        """The perf_counter time the budget runs out (moved back by excluded time); inf without a budget."""
        if self.budget_s is None:
            return float("inf")
        return self.started + self.budget_s + self.excluded_s

    def share_deadline(self, share: float) -> float:
        if self.budget_s is None:
            return float("inf")
        return self.started + share * self.budget_s + self.excluded_s

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    @contextlib.contextmanager
    def span(self, stage: str, name: str | None = None, *, excluded: bool = False) -> Iterator[Span]:
        s = Span(stage, name, self.now())
        self.spans.append(s)
        try:
            yield s
        finally:
            s.end = self.now()
            if excluded:
                self.excluded_s += s.seconds

    def add_span(self, stage: str, start: float, end: float, name: str | None = None, *, excluded: bool = False,
                 note: str | None = None) -> Span:
        """A span measured elsewhere (perf_counter times), e.g. the lock wait inside the transport."""
        s = Span(stage, name, start - self.started, end - self.started, note)
        self.spans.append(s)
        if excluded:
            self.excluded_s += s.seconds
        return s

    def seconds(self, stage: str) -> float:
        return sum(s.seconds for s in self.spans if s.stage == stage)

    def to_dict(self) -> dict:
        """The report's timeline: spans (top level only: no span inside another is counted twice),
        the wall time, and what no span covers."""
        wall = self.now()
        top = _top_level(self.spans)
        covered = sum(s.seconds for s in top if s.end is not None)
        return {"started_unix": round(self.started_unix, 3), "wall_s": round(wall, 3), "budget_s": self.budget_s, "lock_wait_s": round(self.seconds("lock_wait"), 3),
                "spans": [s.to_dict() for s in self.spans if s.end is not None],
                "unattributed_s": round(max(0.0, wall - covered), 3)}

    # --- the deadline builds check ------------------------------------------------------------------
    @contextlib.contextmanager
    def deadline_scope(self, deadline: float, what: str) -> Iterator[None]:
        """Inside: ``check_deadline()`` raises BudgetExceeded past ``deadline`` (perf_counter)."""
        token = _DEADLINE.set((deadline, what, time.perf_counter()))
        try:
            yield
        finally:
            _DEADLINE.reset(token)


def _top_level(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s in sorted((s for s in spans if s.end is not None), key=lambda s: (s.start, -(s.end or 0))):
        if out and s.start >= out[-1].start and (s.end or 0) <= (out[-1].end or 0) + 1e-9:
            continue  # nested in the previous top-level span
        out.append(s)
    return out


_DEADLINE: contextvars.ContextVar[tuple[float, str, float] | None] = contextvars.ContextVar(
    "edgekit_deadline", default=None)


def seconds_left() -> float | None:
    """Seconds until the active deadline (None outside a deadline scope): for a build that can tell
    up front that its next step cannot finish in time and should not start it."""
    active = _DEADLINE.get()
    return None if active is None else active[0] - time.perf_counter()


def budget_exceeded(step: str) -> BudgetExceeded:
    """The error a build raises when it stops (or does not start) ``step`` for the active deadline."""
    active = _DEADLINE.get()
    what, started = (active[1], active[2]) if active is not None else ("the build", time.perf_counter())
    return BudgetExceeded(f"{what} stopped by the time budget after {time.perf_counter() - started:.1f} s ({step})",
                          hint="raise --time-budget, or give the host more free CPU")


def check_deadline(step: str = "") -> None:
    """Called by long builds between units of work (a quantization trial, a fine-tune epoch): past the
    active deadline it raises BudgetExceeded naming the build, the step and the time it ran."""
    active = _DEADLINE.get()
    if active is None:
        return
    deadline, what, started = active
    now = time.perf_counter()
    if now > deadline:
        raise BudgetExceeded(f"{what} stopped by the time budget after {now - started:.1f} s"
                             + (f" (at {step})" if step else ""),
                             hint="raise --time-budget, or give the host more free CPU")


STAGE_ORDER = ("preparation", "build", "host_filter", "lock_wait", "connect", "delivery", "screening", "finals",
               "tuning", "release", "profile", "report")


def stage_totals(spans) -> list[tuple[str, float, int]]:
    """(stage, seconds, spans) in pipeline order, from a timeline's spans (dicts or typed)."""
    totals: dict[str, list] = {}
    for sp in spans:
        stage = sp["stage"] if isinstance(sp, dict) else sp.stage
        secs = sp["seconds"] if isinstance(sp, dict) else sp.seconds
        t = totals.setdefault(stage, [0.0, 0])
        t[0] += secs
        t[1] += 1
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    return [(st, round(v[0], 3), v[1]) for st, v in sorted(totals.items(), key=lambda kv: order.get(kv[0], 99))]


def timeline_line(tl) -> str:
    """One line for the console: ``time: 212 s of a 300 s budget: preparation 9 s, builds 41 s (4), ...``."""
    if tl is None:
        return ""
    get = (lambda k: tl.get(k)) if isinstance(tl, dict) else (lambda k: getattr(tl, k))
    parts = []
    for stage, secs, n in stage_totals(get("spans") or []):
        label = {"build": "builds", "lock_wait": "lock wait (not budgeted)", "host_filter": "host filter"}.get(stage, stage)
        parts.append(f"{label} {secs:.0f} s" + (f" ({n})" if stage == "build" else ""))
    un = get("unattributed_s")
    if un:
        parts.append(f"other {un:.0f} s")
    budget = get("budget_s")
    head = f"time: {get('wall_s'):.0f} s" + (f" of a {budget:g} s budget" if budget is not None else "")
    return head + ": " + ", ".join(parts)


__all__ = ["BudgetExceeded", "Clock", "Span", "check_deadline", "stage_totals", "timeline_line"]


# --- training progress ---------------------------------------------------------------------------------
# (what, epoch done, epochs) -> None: a search's budget students say `epoch k/N` as they train (issue #46)
_EPOCHS: contextvars.ContextVar[Callable[[str, int, int], None] | None] = contextvars.ContextVar(
    "edgekit_epochs", default=None)


@contextlib.contextmanager
def epoch_progress(report: Callable[[str, int, int], None]) -> Iterator[None]:
    """Inside: every training loop's :func:`epoch_done` reaches ``report``."""
    token = _EPOCHS.set(report)
    try:
        yield
    finally:
        _EPOCHS.reset(token)


def epoch_done(what: str, epoch: int, epochs: int) -> None:
    """Called by a training loop after each epoch (1-based): the active :func:`epoch_progress` hears it."""
    report = _EPOCHS.get()
    if report is not None:
        report(what, epoch, epochs)
