"""Scoring a deploy's variants: the metric on the outputs each variant returned from the device,
parity of every output against the float reference, and the paired drop against the baseline.

Built once per run (:func:`eval_plan`), before any pass or device time, so a metric that does
not fit the model's outputs or labels fails at once (exit 2) instead of after the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..agent.protocol import BucketOutputs
from ..convert.parity import compare_outputs
from ..inputs.metric_spec import MetricSpec
from ..inputs.stateful import run as run_stream
from .base import Metric, MetricError, Score
from .paired import paired_drop
from .registry import resolve_metric, select_outputs


@dataclass
class EvalPlan:
    metric: Metric
    spec: MetricSpec
    output_names: list[str]
    output_idx: list[int]  # the outputs the metric reads
    labels: np.ndarray | None  # the eval labels, or None
    reference: list[np.ndarray]  # every output of the float model on the eval inputs
    reference_name: str
    # eval data at several sample shapes (edgekit.inputs.data.Bucket): per bucket, its labels and the float
    # model's outputs; ``labels``/``reference`` above are then bucket 0's, and score()/parity() take
    # a BucketOutputs (one output list per bucket) and read every bucket
    buckets: list["BucketRef"] | None = None

    @property
    def against(self) -> str:
        return "labels" if self.labels is not None else "reference"

    def targets(self) -> np.ndarray | None:
        """What the metric compares with: the labels, or the float model's output (no labels)."""
        if self.labels is not None:
            return self.labels
        return self.reference[self.output_idx[0]] if not self.metric.needs_labels else None

    def fingerprint(self) -> dict:
        """What a cached pass result scored with this plan depends on."""
        return {"metric": self.metric.label(), "outputs": self.output_idx, "against": self.against,
                "options": {k: v for k, v in self.spec.options.items()}, "postprocess": self.spec.postprocess}

    def picked(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        if len(outputs) < len(self.output_names):
            raise MetricError(f"the variant returned {len(outputs)} output(s); the model has "
                              f"{len(self.output_names)} ({', '.join(self.output_names)})")
        return [outputs[i] for i in self.output_idx]

    def per_bucket(self, outputs) -> list[tuple["EvalPlan", list[np.ndarray]]]:
        """(this plan narrowed to one shape bucket, that bucket's outputs) for every bucket."""
        if not self.buckets:
            return [(self, outputs)]
        if not isinstance(outputs, BucketOutputs) or len(outputs) != len(self.buckets):
            got = len(outputs) if isinstance(outputs, BucketOutputs) else "one stacked set of"
            raise MetricError(f"the eval data has {len(self.buckets)} shape buckets and the variant returned {got} "
                              "outputs: it was not run over every bucket")
        return [(replace(self, labels=b.labels, reference=b.reference, buckets=None), o)
                for b, o in zip(self.buckets, outputs)]

    def stats(self, outputs) -> np.ndarray | None:
        """Per-sample sufficient statistics over every bucket (rows in bucket order)."""
        parts = [p.metric.stats(p.picked(o), p.targets()) for p, o in self.per_bucket(outputs)]
        return None if any(x is None for x in parts) else np.concatenate(parts)

    def score(self, outputs) -> Score:
        if not self.buckets:
            return self.metric.evaluate(self.picked(outputs), self.targets(), against=self.against)
        scores = [p.metric.evaluate(p.picked(o), p.targets(), against=p.against) for p, o in self.per_bucket(outputs)]
        st = np.concatenate([sc.stats for sc in scores])  # decomposable: checked by eval_plan
        first = scores[0]
        return Score(metric=first.metric, value=float(self.metric.reduce(st.sum(axis=0))), n=len(st),
                     direction=first.direction, units=first.units, stats=st, against=first.against)

    def accuracy_dict(self, score: Score) -> dict[str, Any]:
        return {**score.to_dict(), "outputs": [self.output_names[i] for i in self.output_idx]}

    def parity(self, outputs: list[np.ndarray]) -> dict[str, dict]:
        """Parity of every output vs the float reference, by output name (integer outputs: exact agreement)."""

        parts = [compare_outputs(p.reference, list(o)[: len(p.reference)], p.reference_name, p.output_names)
                 for p, o in self.per_bucket(outputs)]
        if len(parts) == 1:
            return {name: r.to_dict() for name, r in parts[0].items()}
        return {name: _merged([part[name] for part in parts]) for name in parts[0]}


@dataclass
class BucketRef:
    """One shape bucket of the eval data as the plan scores it."""

    shapes: tuple
    n: int
    labels: np.ndarray | None
    reference: list[np.ndarray]


def _merged(results) -> dict:
    """One output's parity over every shape bucket: the worst bucket's errors and cosine, agreement
    weighted by sample count."""
    n = sum(r.n for r in results)

    def weighted(key):
        vals = [getattr(r, key) for r in results]
        return None if any(v is None for v in vals) else sum(v * r.n for v, r in zip(vals, results)) / n

    return {**results[0].to_dict(), "max_abs_err": max(r.max_abs_err for r in results),
            "mean_abs_err": weighted("mean_abs_err"), "cosine": min(r.cosine for r in results),
            "top1_agreement": weighted("top1_agreement"), "exact_agreement": weighted("exact_agreement"), "n": n,
            "distribution": all(r.distribution for r in results), "top1_held": all(r.top1_held for r in results),
            "buckets": len(results)}


def reference_outputs(source, xs: list[np.ndarray], stream=None) -> list[np.ndarray]:
    """Every output of the float model (the source's reference) on ``xs``; with a ``stream``
    (edgekit/inputs/stateful.py) its constants fed beside the data and its state carried sample to sample."""
    if stream is not None:
        if getattr(source, "run_once", None) is None:
            raise MetricError(f"the {source.reference_name} reference cannot run on a whole feed, which --const/--state "
                              "need", hint="deploy the model as an .onnx or .pt2 file")
        return [np.asarray(o) for o in run_stream(source.run_once, xs, stream)]
    run_all = getattr(source, "reference_all", None)
    if run_all is not None:
        return [np.asarray(o) for o in run_all(xs)]
    return [np.asarray(source.reference(xs))]


def eval_plan(spec: MetricSpec | None, source, eval_ds) -> EvalPlan:
    """The metric, the outputs it reads and the reference outputs; checked against the float model's
    own outputs so that a metric/label/output mismatch is an error before any heavy work."""
    spec = spec or MetricSpec()
    metric = resolve_metric(spec)
    names = [o.name for o in source.artifact.io.outputs] or ["output_0"]
    idx = select_outputs(metric, spec, names)
    if metric.needs_labels and eval_ds.y is None:
        raise MetricError(f"metric {metric.label()} needs labels, and eval data {eval_ds.path.name} has none "
                          f"(no {eval_ds.y_key or 'y'!r} array)",
                          hint="add the labels (--y-key names them), or pick a metric that compares with the "
                          "float model's own outputs: mse, mae, psnr, snr, cosine")
    ref = reference_outputs(source, list(eval_ds.xs), getattr(eval_ds, "stream", None))
    if len(names) != len(ref):
        names = [f"output_{i}" for i in range(len(ref))]
        idx = select_outputs(metric, spec, names)
    plan = EvalPlan(metric=metric, spec=spec, output_names=names, output_idx=idx, labels=eval_ds.y,
                    reference=ref, reference_name=source.reference_name)
    buckets = getattr(eval_ds, "buckets", None)
    if buckets:
        plan.buckets = _bucket_refs(plan, source, eval_ds, ref)
        plan.score(BucketOutputs(b.reference for b in plan.buckets))
    else:
        plan.score(ref)  # raises MetricError naming both shapes when the metric does not fit
    return plan


def _bucket_refs(plan: EvalPlan, source, eval_ds, ref0) -> list[BucketRef]:
    """Eval data at several shapes is scored bucket by bucket, the per-sample statistics joined: the
    metric must be decomposable (per-sample statistics), and no state is carried across shapes."""
    shapes = "; ".join(b.describe() for b in eval_ds.buckets)
    if getattr(eval_ds, "stream", None) is not None and eval_ds.stream.stateful:
        raise MetricError(f"eval data {eval_ds.path.name} holds samples at several shapes ({shapes}), and the model's "
                          "state is carried sample to sample: a stream runs at one shape",
                          hint="deploy once per shape (a folder of shards per shape)")
    if plan.metric.stats(plan.picked(ref0), plan.targets()) is None:
        raise MetricError(f"metric {plan.metric.label()} is not scored per sample, and eval data {eval_ds.path.name} "
                          f"holds samples at several shapes ({shapes}), which are scored bucket by bucket and joined",
                          hint="deploy once per shape, or use a metric with per-sample statistics (a user metric "
                          "may return one score per sample)")
    out = [BucketRef(shapes=eval_ds.buckets[0].shapes, n=eval_ds.buckets[0].n, labels=eval_ds.y, reference=ref0)]
    for b in eval_ds.buckets[1:]:
        out.append(BucketRef(shapes=b.shapes, n=b.n, labels=b.y,
                             reference=reference_outputs(source, list(b.xs), getattr(eval_ds, "stream", None))))
    return out


def score_drops(variants: list, outputs: dict[str, list[np.ndarray]], plan: EvalPlan, baseline: str,
                tolerance: float | None = None) -> list[str]:
    """Fill each variant's ``accuracy_drop`` (in the metric's units, > 0 = worse) and
    ``accuracy_stats`` (paired bootstrap CI, p-value, resolution) against the baseline measured in
    the same run. Returns warnings (an eval set too small to resolve the tolerance)."""

    base = next((v for v in variants if v.name == baseline), None)
    if base is None or base.accuracy is None or baseline not in outputs:
        return []
    warnings: list[str] = []
    # per-sample statistics over every shape bucket; the outputs themselves only for a metric without them
    # (re-scored per resample), which eval_plan refuses for data at several shapes
    base_stats = plan.stats(outputs[baseline])
    targets = plan.targets()
    base_out = None if plan.buckets else plan.picked(outputs[baseline])
    for v in variants:
        if v.accuracy is None or v.name not in outputs:
            continue
        v.accuracy_drop = round(plan.metric.worse_by(base.accuracy.value, v.accuracy.value), 6) + 0.0
        if v is base:
            continue
        var_stats = plan.stats(outputs[v.name]) if base_stats is not None else None
        st = paired_drop(plan.metric, base_out, None if plan.buckets else plan.picked(outputs[v.name]), targets,
                         base_stats=base_stats, var_stats=var_stats)
        v.accuracy_stats = st.to_dict()
        if tolerance is not None and st.resolution is not None and st.resolution > tolerance:
            v.accuracy_stats["resolves_tolerance"] = False
            warnings.append(
                f"{v.name}: the eval set ({st.n} samples) resolves {plan.metric.label()} only to ±{st.resolution:.3g} "
                f"{plan.metric.units or 'units'} (95%), wider than the {tolerance:g} tolerance: a drop that small "
                f"cannot be told from noise here (paired 95% CI of this drop: [{st.ci95[0]:.3g}, {st.ci95[1]:.3g}]); "
                "use more eval samples")
        elif tolerance is not None:
            v.accuracy_stats["resolves_tolerance"] = True
    return warnings
