"""The release gate's device part (``deploy --baseline previous/report.json``): the baseline report's model files
found (at their recorded path, beside the report, in ``--baseline-artifacts`` or in the pass cache, always by
sha256) and, for the ``ab`` method, re-measured against the new ones in this run's (still open) device session.
The methods, their statistics and the gate's checks are ``report/release.py``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..agent.protocol import AgentRunFailed
from ..artifact import Artifact
from ..fsutil import sha256_file
from ..report.diff import counterpart
from ..report.model import VariantResult
from ..report.release import LatencyJudgement, ReleaseJudgement, choose_method, judge_ab, judge_normalized
from .cache import find_by_sha256

if TYPE_CHECKING:
    from ..devices.session import DeviceSession, Measured, RunSettings
    from .options import DeployOptions
    from .prepare import PreparedRun

Progress = Callable[[str], None]


def release_judgement(
    session: DeviceSession,
    run: PreparedRun,
    measured: dict[str, Measured],
    judged: list[str],
    settings: RunSettings,
    opts: DeployOptions,
    progress: Progress | None = None,
    shipped: str | None = None,
) -> ReleaseJudgement | None:
    """The deploy options' release method for this run (None without --baseline); see judge_release.
    ``shipped``: the variant this run ships (a search's choice), judged against the previously shipped
    one when the baseline report has no variant of its name (``diff.counterpart``)."""
    if run.previous is None:
        return None
    return judge_release(
        session,
        run,
        measured,
        judged,
        settings,
        requested=opts.release_method,
        blocks=opts.ab_blocks,
        progress=progress,
        shipped=shipped,
        baseline_artifacts=Path(opts.baseline_artifacts) if opts.baseline_artifacts else None,
    )


def find_baseline_artifact(v: VariantResult, report_path: Path | None, extra_dir: Path | None) -> Path | None:
    """The baseline report's model file for ``v``, only where its sha256 matches."""
    if not v.artifact_path:
        return None
    recorded = Path(v.artifact_path)
    cands = [recorded]
    if extra_dir is not None:
        cands.append(Path(extra_dir) / recorded.name)
    if report_path is not None:
        cands.append(Path(report_path).parent / "artifacts" / recorded.name)
    for c in cands:
        try:
            if c.is_file() and c.stat().st_size == v.size_bytes and sha256_file(c) == v.sha256:
                return c
        except OSError:
            continue
    return find_by_sha256(v.sha256, recorded.suffix)


def judge_release(
    session: DeviceSession,
    run: PreparedRun,
    measured: dict[str, Measured],
    judged: list[str],
    settings: RunSettings,
    *,
    requested: str = "auto",
    blocks: int = 6,
    baseline_artifacts: Path | None = None,
    progress: Progress | None = None,
    shipped: str | None = None,
) -> ReleaseJudgement:
    """Choose the method and, for ``ab``, re-measure the baseline report's models against the new
    ones in this (still open) device session."""
    previous = run.previous
    if previous is None:
        raise ValueError("judge_release needs the run's baseline report (run.previous)")
    say: Progress = progress or (lambda _m: None)
    new = {n: m.result for n, m in measured.items()}
    judged_v = [new[n] for n in judged if n in new]
    # each judged variant's counterpart in the baseline report, under the new variant's name
    old = {v.name: o for v in judged_v if (o := counterpart(previous, v.name, shipped)) is not None}
    old.update({v.name: v for v in previous.variants if v.name not in old})
    ab_files: dict[str, Path] = {}
    for v in judged_v:
        # A/B runs both files through one runtime: a counterpart of another format is judged otherwise
        if v.name in old and old[v.name].format == v.format:
            f = find_baseline_artifact(old[v.name], run.previous_path, baseline_artifacts)
            if f is not None:
                ab_files[v.name] = f
    reference = new.get(run.recipe.baseline) if run.recipe.baseline in new else None
    method = choose_method(requested, previous, judged_v, ab_files, reference, old)
    judgements: dict[str, LatencyJudgement] = {}
    detail: dict[str, Any] = {"requested": requested}
    if method == "ab":
        for v in judged_v:
            if v.name not in ab_files:
                continue
            say(
                f"release gate: A/B re-measurement of {v.name} against the baseline report's model "
                f"({blocks} blocks each)"
            )
            new_art = measured[v.name].artifact
            # the baseline's model through the new variant's interface; the agent checks its sha256
            old_art = Artifact.from_file(ab_files[v.name], new_art.format, new_art.io, precision=new_art.precision)
            try:
                blocks_ab = session.measure_ab(old_art, new_art, settings, blocks)
            except AgentRunFailed as exc:  # e.g. the model's interface changed: judged directly instead
                detail[v.name] = {"baseline_file": str(ab_files[v.name]), "ab_failed": exc.message}
                continue
            j = judge_ab(blocks_ab, run.gate.significance_alpha)
            judgements[v.name] = j
            detail[v.name] = {
                "baseline_file": str(ab_files[v.name]),
                "same_file": old[v.name].sha256 == v.sha256,
                **({"baseline_variant": old[v.name].name} if old[v.name].name != v.name else {}),
                **({"ab_warnings": blocks_ab.warnings} if blocks_ab.warnings else {}),
                **j.detail,
            }
    elif method == "normalized" and reference is not None:  # choose_method gives it only with a reference
        old_ref = next(o for o in previous.variants if o.name == reference.name)
        for v in judged_v:
            if v.name in old and v.name != reference.name:
                jn = judge_normalized(old[v.name], old_ref, v, reference)
                if jn is not None:
                    judgements[v.name] = jn
                    detail[v.name] = jn.detail
    return ReleaseJudgement(method=method, judgements=judgements, detail=detail)
