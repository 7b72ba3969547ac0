"""Report schema (see DESIGN.md, "Report contract").

``schema_version`` is MAJOR.MINOR: a report with the same MAJOR loads (unknown newer fields are
kept); another MAJOR is refused with a clear message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import BadInputError
from ..fsutil import atomic_write_text

SCHEMA_VERSION = "1.2"  # 1.1: energy/sustained/measurement/search/comparison; 1.2: task metrics, per-output parity


class _Open(BaseModel):
    # Reports written by newer edgekit versions may carry fields this one does not know: keep them.
    model_config = ConfigDict(extra="allow")


class RuntimeInfo(_Open):
    name: str
    version: str | None = None
    threads: int | None = None
    delegate: str | None = None


class LatencyMs(_Open):
    warmup: int
    runs: int
    raw: list[float] | None = None
    raw_path: str | None = None
    mean: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float
    ci95: list[float]
    cov: float
    outliers: int
    stable: bool
    robust_cov: float | None = None  # 1.4826*MAD/median; what `stable` is judged on (absent in 1.0 reports)


class Accuracy(_Open):
    """The task metric on the eval set (top1 in %, miou in %, map50 in %, mse, psnr in dB...)."""

    metric: str
    value: float
    n: int
    direction: str = "higher"  # higher | lower is better
    units: str = "%"
    against: str = "labels"  # labels | reference (the float model's own outputs)
    outputs: list[str] | None = None  # the outputs the metric read


class Parity(_Open):
    reference: str
    max_abs_err: float
    mean_abs_err: float
    cosine: float
    top1_agreement: float | None = None
    n: int


class VariantResult(_Open):
    name: str
    format: str
    precision: str
    runtime: RuntimeInfo
    size_bytes: int
    sha256: str
    artifact_path: str | None = None
    lineage: list[dict[str, Any]] = Field(default_factory=list)
    load_ms: float | None = None
    latency_ms: LatencyMs | None = None
    peak_memory_mb: float | None = None
    memory: dict[str, Any] = Field(default_factory=dict)
    energy_mj_per_inference: float | None = None
    energy_source: str | None = None
    energy_reason: str | None = None
    # The agent's full energy record: source, sample rate, baseline, uncertainty (see edgekit_agent.py).
    energy: dict[str, Any] = Field(default_factory=dict)
    # Sustained mode: latency bins over time and first vs last segment (edgekit.measure.sustained).
    sustained: dict[str, Any] | None = None
    # Where the numbers come from: {"reused": true, "measured_at": ...} when taken from the measurement cache.
    measurement: dict[str, Any] = Field(default_factory=dict)
    accuracy: Accuracy | None = None
    # baseline - variant in the metric's units (for a lower-is-better metric: variant - baseline); > 0 = worse
    accuracy_drop: float | None = None
    # the drop judged on paired per-sample results: 95% CI, p-value, method, the eval set's resolution
    accuracy_stats: dict[str, Any] | None = None
    # baseline p50 / this variant's p50, both measured on the device (> 1 = faster); None when unmeasured
    speedup_vs_baseline: float | None = None
    parity: Parity | None = None  # the first output's (the contract field)
    parity_outputs: dict[str, Parity] | None = None  # every output's, by name
    selected: bool = False
    device_state: dict[str, Any] = Field(default_factory=dict)


class Check(_Open):
    name: str
    variant: str | None = None
    value: float | None = None
    limit: float | None = None
    passed: bool
    message: str
    # Set on checks against a baseline report (latency regression): the test's p-value and verdict.
    p_value: float | None = None
    significant: bool | None = None
    skipped: bool = False  # not applicable here (e.g. a latency budget on an emulated device); says why


class Gate(_Open):
    passed: bool
    checks: list[Check] = Field(default_factory=list)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]


class Report(_Open):
    schema_version: str = SCHEMA_VERSION
    edgekit_version: str
    created_at: str
    target: str
    device: dict[str, Any]
    model: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    baseline: str
    variants: list[VariantResult]
    gate: Gate
    warnings: list[str] = Field(default_factory=list)
    # The previous report this run was compared with (`--baseline`), and the comparison (a ReportDiff).
    compared_with: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None

    def metric_label(self) -> str:
        """The metric's column header, e.g. "top1 %", "miou %", "mse", "psnr dB"."""
        acc = next((v.accuracy for v in self.variants if v.accuracy is not None), None)
        if acc is None:
            return "accuracy"
        return f"{acc.metric} {acc.units}".strip()

    def metric_line(self) -> str:
        """One sentence on what scored the eval pass."""
        m = (self.settings or {}).get("metric") or {}
        acc = next((v.accuracy for v in self.variants if v.accuracy is not None), None)
        if not m and acc is None:
            return "metric: none measured"
        name = m.get("name") or (acc.metric if acc else "?")
        direction = m.get("direction") or (acc.direction if acc else "higher")
        against = m.get("against") or (acc.against if acc else "labels")
        outs = m.get("outputs") or (acc.outputs if acc else None)
        n = acc.n if acc else None
        return (f"metric: {name} ({direction} is better) on {n if n is not None else '?'} eval samples, against "
                f"{'the labels' if against == 'labels' else 'the float model outputs (no labels)'}"
                + (f", reading output(s) {', '.join(outs)}" if outs else "")
                + (f"; model inputs {', '.join(self.settings.get('eval_inputs'))}" if self.settings.get("eval_inputs") else ""))

    def variant(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r} in report; variants: {[v.name for v in self.variants]}")

    def diff(self, other: "Report", *, alpha: float = 0.05, min_effect: float = 0.10):
        """What changed in this report relative to ``other`` (e.g. the last release): a ReportDiff."""
        from .diff import diff_reports

        return diff_reports(other, self, alpha=alpha, min_effect=min_effect)

    # --- persistence -----------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise BadInputError(f"report {p} not found") from exc
        except (OSError, ValueError) as exc:
            raise BadInputError(f"report {p} is not readable JSON ({exc})") from exc
        if not isinstance(data, dict) or "schema_version" not in data:
            raise BadInputError(f"{p} is not an edgekit report (no schema_version)")
        major = str(data["schema_version"]).split(".")[0]
        if major != SCHEMA_VERSION.split(".")[0]:
            raise BadInputError(
                f"{p} has report schema {data['schema_version']}; this edgekit reads {SCHEMA_VERSION.split('.')[0]}.x",
                hint="open it with the edgekit version that wrote it (see its edgekit_version field)",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise BadInputError(f"{p} is not a valid edgekit report: {exc.error_count()} problem(s), first: "
                                f"{exc.errors()[0]['loc']} {exc.errors()[0]['msg']}") from exc

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write report.json, report.md, report.html and junit.xml into ``out_dir``, each atomically."""
        from .html import render_html
        from .junit import render_junit
        from .markdown import render_markdown

        out = Path(out_dir)
        paths = {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html",
                 "junit": out / "junit.xml"}
        # Render everything before touching the folder, so a rendering bug cannot leave a mix.
        texts = {"md": render_markdown(self), "html": render_html(self), "junit": render_junit(self),
                 "json": self.to_json()}
        for key in ("md", "html", "junit", "json"):  # report.json last: it marks a complete set
            atomic_write_text(paths[key], texts[key])
        return paths
