"""What removing channels buys on the device (issue #46): each prunable group at a few widths, measured
in the runtime and encoding that will ship, NetAdapt-style.

A point is the model with one group pruned to one width (the others full, no fine-tune: latency does
not depend on the weights), built through the encoding's own passes (``prune_widths`` first, then e.g.
static INT8 QDQ or LiteRT conversion). The unpruned model goes through the same chain (``prune_widths``
with no widths), so every point differs from the base by the widths only. Each point is timed against the
base in alternating rounds in one agent process (``DeviceSession.measure_ab``, the finals' rounds), so the
drift of a shared device hits both alike: the paired ratio and its 95% CI (``report/release.judge_ab``) give
the point's p50 as a share of the base's. A width *pays* when it is not tied with the base by the project's one
tie rule (``report/decision.TIE_TOLERANCE``): the ratio's CI lies wholly below 1 - 5%. A width that does not pay
is never chosen.

The table is kept per device, runtime (and its version), encoding and measurement settings, keyed by
content like the measurement cache (``$EDGEKIT_HOME/cache/latency-tables``), and reused by the next run;
a table whose base was measured on a busy device is not stored. ``EDGEKIT_NO_CACHE=1`` or
``EDGEKIT_NO_TABLE_CACHE=1`` turns it off.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..devices.session import MeasureFailure
from ..errors import DeviceError
from ..formats import format_spec
from ..inputs.recipe import PassStep, Recipe, VariantSpec
from ..measure.cache import device_identity
from ..orchestration.steps import build_variants
from ..passes.base import PassContext
from ..paths import cache_dir
from ..report.decision import TIE_TOLERANCE
from ..report.release import judge_ab

if TYPE_CHECKING:
    from ..devices.session import DeviceSession, RunSettings
    from ..orchestration.prepare import PreparedRun

Progress = Callable[[str], None]
FORMAT = 2  # 2: points carry their paired ratio to the base
# a width pays when its ratio's CI lies below 1 - MIN_GAIN: the one tie rule's band. Seen here: timed one after
# another on a busy 2-core host, a planted 16-unit hidden layer beside a conv trunk read up to 5% faster pruned, or
# slower; in alternating rounds 0.97 (CI 0.89-0.99) at worst
MIN_GAIN = TIE_TOLERANCE
ROUNDS = 12  # alternating rounds per point (rounds.ROUNDS)


@dataclass
class Point:
    p50: float
    ci95: tuple[float, float]
    ratio: float | None = None  # to the base, paired over alternating rounds (None: the base itself)
    ratio_ci95: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"p50": round(self.p50, 6), "ci95": [round(self.ci95[0], 6), round(self.ci95[1], 6)],
                **({"ratio_to_base": round(self.ratio, 4), "ratio_ci95": [round(self.ratio_ci95[0], 4),
                                                                          round(self.ratio_ci95[1], 4)]}
                   if self.ratio is not None and self.ratio_ci95 is not None else {})}


@dataclass
class LatencyTable:
    """The base (unpruned) point and each group's points by width, with where and how they were measured."""

    key: str
    encoding: str  # the search candidate whose passes make the shipped encoding ("fp32": the float ONNX)
    runtime: str
    runtime_version: str | None
    device: dict[str, Any]
    base: Point
    points: dict[str, dict[int, Point]] = field(default_factory=dict)
    reused: bool = False
    measured_at: str = ""
    stored: str | None = None  # why it was not stored, or None

    def pays(self, group: str, width: int) -> bool:
        """Whether the width is clearly faster than the base on this device: the paired ratio's CI wholly below
        1 - MIN_GAIN (not tied with it by the one tie rule)."""
        p = self.points.get(group, {}).get(width)
        if p is None or p.ratio is None or p.ratio_ci95 is None:
            return False
        return p.ratio_ci95[1] < 1.0 - MIN_GAIN

    quantity = "latency"

    def paying(self, group: str) -> list[int]:
        """The group's widths that pay, widest first."""
        return [w for w in sorted(self.points.get(group, {}), reverse=True) if self.pays(group, w)]

    def unpaid(self, group: str) -> str | None:
        """Why the group stays whole for latency (it was measured and no width of it pays), or None."""
        if not self.points.get(group) or self.paying(group):
            return None
        return (f"no width of {group} is clearly faster on the device than the whole model (base p50 "
                f"{self.base.p50:.4g} ms, 95% CI [{self.base.ci95[0]:.4g}, {self.base.ci95[1]:.4g}]; "
                + ", ".join(f"{w}: {p.p50:.4g} ms" for w, p in sorted(self.points[group].items())) + ")")

    def saving(self, group: str, width: int) -> float:
        """Milliseconds the width saves over the base (0 for the full width; may be negative: noise)."""
        p = self.points.get(group, {}).get(width)
        return 0.0 if p is None else self.base.p50 - p.p50

    def predict(self, widths: dict[str, int]) -> float:
        """The predicted p50 of the model with these widths: the base times each group's ratio to it. Multiplied,
        not summed: summed savings overshoot (a fixed per-inference cost is not pruned away; seen here: the sum
        predicted 0.090 ms for a PlantedNet measured at 0.109, the product 0.113) and never go below zero."""
        out = self.base.p50
        for g, w in widths.items():
            out *= max(1.0 - self.saving(g, w) / self.base.p50, 0.0) if self.base.p50 > 0 else 1.0
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "key": self.key, "encoding": self.encoding, "runtime": self.runtime,
                "runtime_version": self.runtime_version, "device": self.device, "base": self.base.to_dict(),
                "points": {g: {str(w): p.to_dict() for w, p in sorted(ws.items())} for g, ws in self.points.items()},
                "measured_at": self.measured_at, "reused": self.reused,
                **({"not_stored": self.stored} if self.stored else {})}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "LatencyTable":
        def pt(d: dict[str, Any]) -> Point:
            r, rc = d.get("ratio_to_base"), d.get("ratio_ci95")
            return Point(float(d["p50"]), (float(d["ci95"][0]), float(d["ci95"][1])),
                         None if r is None else float(r), None if rc is None else (float(rc[0]), float(rc[1])))

        return cls(key=doc["key"], encoding=doc["encoding"], runtime=doc["runtime"],
                   runtime_version=doc.get("runtime_version"), device=doc.get("device") or {}, base=pt(doc["base"]),
                   points={g: {int(w): pt(p) for w, p in ws.items()} for g, ws in doc["points"].items()},
                   measured_at=doc.get("measured_at", ""))


def table_root() -> Any:
    return cache_dir("latency-tables")


def table_key(*, source_sha: str, arch: str, grid: dict[str, list[int]], encoding: list[PassStep],
              identity: dict[str, Any], runtime: str, runtime_version: str | None, measure: dict[str, Any]) -> str:
    doc = {"format": FORMAT, "source": source_sha, "arch": arch, "grid": {g: sorted(ws) for g, ws in grid.items()},
           "encoding": [s.model_dump(mode="json") for s in encoding], "device": identity, "runtime": runtime,
           "runtime_version": runtime_version, "measure": measure}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def table_cache_disabled() -> bool:
    return any(os.environ.get(k, "").strip() not in ("", "0") for k in ("EDGEKIT_NO_CACHE", "EDGEKIT_NO_TABLE_CACHE"))


def _load(key: str) -> LatencyTable | None:
    if table_cache_disabled():
        return None
    p = table_root() / f"{key}.json"
    try:
        t = LatencyTable.from_dict(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    t.reused = True
    return t


def _store(t: LatencyTable) -> None:
    if table_cache_disabled():
        return
    root = table_root()
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".table-", dir=root)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(t.to_dict(), f, indent=1)
    os.replace(tmp, root / f"{t.key}.json")  # atomic: a crash never leaves half a table a later run trusts


def measure_table(session: DeviceSession, run: PreparedRun, ctx: PassContext, *, encoding_name: str,
                  encoding: list[PassStep], grid: dict[str, list[int]], settings: RunSettings,
                  progress: Progress) -> LatencyTable:
    """The table for ``encoding`` on the session's device: reused from the cache when it has it, else measured."""
    runtime = format_spec(_encoding_format(run, ctx, encoding)).runtime or "?"
    probe = session.measurements.probe_doc()
    version = (probe.get("runtimes") or {}).get(runtime)
    identity = device_identity(probe, session.device, session._t.kind)
    timing = settings.measure.model_dump(mode="json")
    key = table_key(source_sha=run.source.artifact.sha256, arch=str(run.arch), grid=grid, encoding=encoding,
                    identity=identity, runtime=runtime, runtime_version=version, measure=timing)
    if not session.remeasure and (hit := _load(key)) is not None:
        progress(f"latency table for {encoding_name} on this device reused (measured {hit.measured_at})")
        return hit
    timed = settings.but(with_eval=False)
    busy: list[str] = []

    def build(name: str, widths: dict[str, int]) -> Any:
        return build_point(run, ctx, encoding, name, widths)

    progress(f"latency table for {encoding_name}: the base and {sum(map(len, grid.values()))} pruned points, each "
             f"against the base in {ROUNDS} alternating rounds on the device")
    base_art = build(f"table-{encoding_name}-base", {})
    m = session.measure(f"table-{encoding_name}-base", base_art, timed)
    if isinstance(m, MeasureFailure) or m.result.latency_ms is None:
        raise DeviceError(f"the latency table's base ({encoding_name}) could not be measured: "
                          f"{getattr(m, 'message', 'no timings came back')}")
    if str(m.result.measurement.get("cache", "")).startswith("not stored"):
        busy.append("base")
    lat = m.result.latency_ms
    base = Point(lat.p50, (lat.ci95[0], lat.ci95[1]))
    points: dict[str, dict[int, Point]] = {}
    for g, ws in grid.items():
        for w in ws:
            progress(f"latency table for {encoding_name}: {g} at {w} channels")
            art = build(f"table-{encoding_name}-{g}-{w}", {g: w})
            j = judge_ab(session.measure_ab(base_art, art, timed, ROUNDS))
            points.setdefault(g, {})[w] = Point(base.p50 * j.ratio, (base.p50 * j.ci95[0], base.p50 * j.ci95[1]),
                                                j.ratio, (j.ci95[0], j.ci95[1]))
    t = LatencyTable(key=key, encoding=encoding_name, runtime=runtime, runtime_version=version, device=identity,
                     base=base, points=points, measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(
                         timespec="seconds"))
    if busy:
        t.stored = f"not stored: measured on a busy device ({', '.join(busy[:3])})"
    else:
        _store(t)
    return t


def build_point(run: PreparedRun, ctx: PassContext, encoding: list[PassStep], name: str,
                widths: dict[str, int]) -> Any:
    """The source model with ``widths`` (no fine-tune: latency, memory and size do not depend on the weights),
    through the encoding's passes (the pass cache makes a point built before free)."""
    step = PassStep(name="prune_widths", config={"widths": widths, "finetune_epochs": 0})
    spec = VariantSpec(name=name, passes=[step, *encoding])
    return build_variants(run.fp32, Recipe(baseline="fp32", variants=[spec]), ctx, lambda _m: None,
                          source=run.source, cache=run.cache)[name]


def _encoding_format(run: PreparedRun, ctx: PassContext, encoding: list[PassStep]) -> Any:
    """The format the encoding's passes end in (a convert step names its target; otherwise ONNX)."""
    from ..formats import Format

    for step in reversed(encoding):
        to = (step.config or {}).get("to")
        if step.name == "convert" and to:
            return Format(to)
    return Format.ONNX
