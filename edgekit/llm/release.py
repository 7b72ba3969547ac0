"""The release gate for a language model (issue #37, item 3): this run's shipped file against the last
release's, measured side by side on the same device in the same session.

``--baseline OUT/report.json`` names the last release (a language-model report with ``ship/`` beside it). Its
shipped file, checked against the sha256 the report recorded, is measured again in this session with the same
workload and its own runtime settings (a figure from another day is not comparable: clocks, heat and load
differ), and the gate adds:

- ``release_decode``: this release's decode speed against the last release's, the two files timed in
  alternating rounds in this session (the session's A/B: ``workload.GenerationWorkload.measure_ab``). It fails
  when this release decodes more than
  ``max_decode_regression`` (``--max-latency-regression``, default 10%) slower by the median round ratio and
  the slowdown is significant (its 95% CI excludes no change and the signed-rank test agrees): a drop inside
  the noise is not a regression;
- ``release_kld`` (when both releases come from the same model, by its sha256): the mean KLD from the float
  model may not grow by more than ``max_kld_increase`` (default 0.01 nats a token, a fifth of the default
  ``--max-kld``) over the last release's, measured now on the same text;
- ``release_perplexity`` (same eval text): perplexity may not grow by more than ``max_perplexity_increase`` of
  the last release's (default 2%).

The last release's re-measurement (its figures and its scoring, beside this release's files) is in the report
as a variant named ``release:<its name>``; it takes no part in the decision."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..artifact import Artifact, IOSpec, LineageStep
from ..errors import BadInputError
from ..formats import Format
from ..fsutil import sha256_file
from ..report.model import Check, ComparedWith, Report, VariantResult
from ..report.release import LatencyJudgement

PREFIX = "release:"


@dataclass(frozen=True)
class ReleaseGate:
    max_decode_regression: float = 0.10  # as --max-latency-regression's default for fixed models
    max_kld_increase: float = 0.01
    max_perplexity_increase: float = 0.02
    rounds: int = 8  # the decode A/B's pairs of turns (whole decode-only agent runs)


@dataclass(frozen=True)
class LastRelease:
    path: Path
    report: Report
    variant: VariantResult
    artifact: Artifact

    @property
    def name(self) -> str:
        return PREFIX + self.variant.name


def load_last_release(path: str | Path) -> LastRelease:
    """The last release from its report.json; exit 2 naming what is wrong (not a language model's report,
    nothing shipped, the shipped file gone or changed since)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise BadInputError(f"--baseline {path}: no such report", hint="pass the last release's OUT/report.json")
    report = Report.load(path)
    if report.model.get("task") != "text-generation":
        raise BadInputError(
            f"--baseline {path} is a fixed-graph model's report, not a language model's",
            hint="compare a language model with an earlier `edgekit deploy MODEL_DIR --eval-text` run",
        )
    name = report.decision.ship if report.decision is not None else None
    v = report.variant(name) if name else None
    shipped = report.search.shipped if report.search is not None else None
    if v is None or shipped is None or not shipped.file:
        raise BadInputError(
            f"--baseline {path}: that run shipped nothing, so there is no release to compare with",
            hint="use the report of a run whose gate passed",
        )
    file = Path(shipped.file)
    if not file.is_file():
        file = path.parent / "ship" / file.name
    if not file.is_file():
        raise BadInputError(
            f"--baseline {path}: its shipped file {file.name} is not in {path.parent / 'ship'}",
            hint="keep the last release's ship/ folder beside its report.json",
        )
    digest = sha256_file(file)
    if shipped.sha256 and digest != shipped.sha256:
        raise BadInputError(
            f"--baseline {path}: {file} changed since that run (sha256 {digest[:12]}, the report "
            f"says {shipped.sha256[:12]})",
            hint="restore the released file or deploy it again",
        )
    fmt = Format(v.format)
    options = dict(v.runtime.options or {})
    art = Artifact.from_file(
        file,
        fmt,
        IOSpec(inputs=(), outputs=()),
        precision=v.precision,
        lineage=[
            LineageStep(kind="convert", name="last release", config={"report": str(path), "runtime_options": options})
        ],
    )
    return LastRelease(path=path, report=report, variant=v, artifact=art)


def release_checks(
    new: VariantResult | None,
    again: VariantResult | None,
    last: LastRelease,
    model_sha: str | None,
    text_sha: str | None,
    cfg: ReleaseGate,
    again_failure: str | None = None,
    ab: LatencyJudgement | None = None,
    ab_failure: str | None = None,
) -> list[Check]:
    """The release checks above (``ab``: the decode A/B's judgement, ``DeviceSession.measure_ab``); a check that
    cannot be judged says why (and fails: the gate never passes on a figure it does not have)."""
    if new is None:
        return []  # nothing shipped this time: the gate already failed
    if again is None or again.generation is None or new.generation is None:
        return [
            Check(
                name="release_decode",
                variant=new.name,
                passed=False,
                message=f"the last release's file ({last.variant.name}) could not be measured again in this "
                "session, so this release cannot be compared with it" + (f": {again_failure}" if again_failure else ""),
            )
        ]
    checks = [_decode_check(new, last, cfg, ab, ab_failure)]
    same_model = model_sha is not None and model_sha == last.report.model.get("sha256")
    same_text = text_sha is not None and text_sha == (last.report.settings.get("eval_text") or {}).get("windows_sha256")
    if new.quality is not None and again.quality is not None:
        if same_model:
            grow = new.quality.kld_mean - again.quality.kld_mean
            checks.append(
                Check(
                    name="release_kld",
                    variant=new.name,
                    value=grow,
                    limit=cfg.max_kld_increase,
                    passed=grow <= cfg.max_kld_increase,
                    message=f"KLD {new.quality.kld_mean:.4g} vs the last release's "
                    f"{again.quality.kld_mean:.4g} on the same model and text: "
                    f"{grow:+.4g} nats/token",
                )
            )
        if same_text:
            rel = new.quality.perplexity / again.quality.perplexity - 1
            checks.append(
                Check(
                    name="release_perplexity",
                    variant=new.name,
                    value=rel,
                    limit=cfg.max_perplexity_increase,
                    passed=rel <= cfg.max_perplexity_increase,
                    message=f"perplexity {new.quality.perplexity:.4g} vs the last release's "
                    f"{again.quality.perplexity:.4g} on the same text: {rel:+.2%}",
                )
            )
    return checks


def _decode_check(
    new: VariantResult, last: LastRelease, cfg: ReleaseGate, ab: LatencyJudgement | None, ab_failure: str | None
) -> Check:
    if ab is None:
        return Check(
            name="release_decode",
            variant=new.name,
            passed=False,
            message=f"the decode A/B against the last release's {last.variant.name} did not run"
            + (f": {ab_failure}" if ab_failure else ""),
        )
    speed = 1.0 / ab.ratio  # this release's decode speed over the last release's
    lo, hi = 1.0 / ab.ci95[1], 1.0 / ab.ci95[0]
    regressed = speed < 1 - cfg.max_decode_regression and ab.significant and ab.ratio > 1
    p = f", signed-rank p={ab.p_value:.3g}" if ab.p_value is not None else ""
    return Check(
        name="release_decode",
        variant=new.name,
        value=speed,
        limit=1 - cfg.max_decode_regression,
        ratio_ci95=[lo, hi],
        p_value=ab.p_value,
        significant=ab.significant,
        passed=not regressed,
        message=f"decode speed {speed:.2f}x the last release's {last.variant.name} (95% CI {lo:.2f}-{hi:.2f}"
        f"{p}), the two files timed in {ab.detail.get('blocks')} alternating rounds in this session"
        + (
            ": significantly slower, a regression"
            if regressed
            else ": within the noise (not significant)"
            if speed < 1 - cfg.max_decode_regression
            else ""
        ),
    )


METHOD = "ab"
METHOD_TEXT = (
    "the last release's shipped file and this release's timed in alternating rounds in this session "
    "(decode), and scored again beside this release's files (quality)"
)


def compared_with(last: LastRelease, ab: LatencyJudgement | None = None) -> ComparedWith:
    r = last.report
    return ComparedWith(
        path=str(last.path),
        sha256=last.artifact.sha256,
        method=METHOD,
        method_text=METHOD_TEXT,
        method_detail={
            "variant": last.variant.name,
            "file": str(last.artifact.path),
            **(ab.detail if ab is not None else {}),
        },
        created_at=r.created_at,
        edgekit_version=r.edgekit_version,
        target=r.target,
        device=r.device.name if r.device is not None else None,
        model_sha256=r.model.get("sha256"),
        model=r.model.get("source"),
    )
