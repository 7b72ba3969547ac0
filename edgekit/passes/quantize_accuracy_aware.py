"""Accuracy-aware INT8 (onnxruntime): the fastest INT8 configuration that stays inside an accuracy
tolerance, found by measurement on the eval set -- never a silently degraded model.

Start from full INT8. While the drop is outside the tolerance, try keeping each remaining
quantizable op in float (one at a time, on top of the ops already kept), keep the one whose
float copy recovers the most accuracy (ties broken by the output error vs fp32), and repeat.
Every decision is recorded (the op, its accuracy gain, the candidates it beat) in the lineage.
When no configuration meets the tolerance the pass raises PassError naming the best one found.

Note: the search is scored on the eval set it is given; the device measures on the same set, so
give a held-out split as ``--eval-data`` if the reported accuracy must be unbiased.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from ..artifact import Artifact
from ..errors import DataError, PassError
from ..formats import Format
from ..logs import quiet
from .base import Pass, PassContext, PassOutput
from .quantize_ort import OrtQuantize, OrtQuantizeConfig


class AccuracyAwareConfig(OrtQuantizeConfig):
    max_accuracy_drop: float = Field(1.0, ge=0, le=100, description="accuracy points vs fp32 (1 = one point)")
    relative: bool = Field(False, description="read max_accuracy_drop as percent of the fp32 accuracy")
    # rerank: re-measure every remaining candidate after each op kept in float (N*K trials, best set);
    # rank_once: rank ops once by single-op sensitivity and keep them in that order (N+K trials).
    strategy: Literal["rerank", "rank_once"] = "rerank"
    max_float_ops: int | None = Field(None, ge=0, description="give up after keeping this many ops in float")
    max_trials: int = Field(400, ge=1, description="quantize+evaluate budget of the search")
    eval_samples: int | None = Field(None, ge=1, description="score on the first N eval samples (default all)")


def tolerance_points(max_drop: float, relative: bool, base_accuracy: float) -> float:
    """The tolerance in accuracy points (``relative`` reads ``max_drop`` as percent of the baseline)."""
    return max_drop * base_accuracy / 100.0 if relative else max_drop


def quantizable_ops() -> set[str]:
    """Op types onnxruntime's static quantizer handles by default (QOperator and QDQ registries)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return set(QDQRegistry) | set(QLinearOpsRegistry)


class _Scorer:
    """The deploy's metric (``ctx.extras["metric_plan"]``; top-1 on the first output without one) of
    an ONNX file on the eval set, and its output MSE vs the first trial. ``__call__`` returns
    (goodness, mse) where goodness is the metric value signed so that higher is better."""

    def __init__(self, xs: list[np.ndarray], y: np.ndarray | None, plan=None):
        from ..metrics import get_metric

        n = len(xs[0])
        self.xs = xs
        self.metric = plan.metric if plan is not None else get_metric("top1")
        self.idx = plan.output_idx if plan is not None else [0]
        targets = plan.targets() if plan is not None else y
        self.targets = None if targets is None else targets[:n]
        self.sign = 1.0 if self.metric.direction == "higher" else -1.0
        self.ref: np.ndarray | None = None

    def value(self, goodness: float) -> float | None:
        """The metric value of a goodness (None for a trial onnxruntime could not run: no number)."""
        return self.sign * goodness if np.isfinite(goodness) else None

    def __call__(self, path: Path) -> tuple[float, float]:
        from ..source import ort_reference_all

        outs = ort_reference_all(path)(self.xs)
        picked = [outs[i] for i in self.idx]
        value = self.metric.evaluate(picked, self.targets).value
        first = np.asarray(picked[0], dtype=np.float32)
        if self.ref is None:
            self.ref = first
        mse = float(np.mean((first - self.ref) ** 2))
        return self.sign * value, mse


class AccuracyAwareQuantize(Pass):
    name = "quantize_accuracy_aware"
    Config = AccuracyAwareConfig
    input_formats = (Format.ONNX,)

    def run(self, artifact, config: AccuracyAwareConfig, ctx: PassContext, stem: str) -> PassOutput:
        import onnx

        if ctx.eval is None:
            raise DataError("accuracy-aware quantization needs an eval set",
                            hint="pass --eval-data EVAL.npz (inputs and labels), or use the plain `quantize` pass")
        plan = ctx.extras.get("metric_plan")
        if plan is None and ctx.eval.y is None:
            raise DataError(f"eval data {ctx.eval.path} has no labels; accuracy-aware quantization scores top-1 on them",
                            hint="add y=labels to the .npz, or deploy with a metric that needs none (--metric mse)")
        n = config.eval_samples or ctx.eval.n
        scorer = _Scorer([x[:n] for x in ctx.eval.xs], ctx.eval.y, plan)
        base_cfg = OrtQuantizeConfig(**config.model_dump(include=set(OrtQuantizeConfig.model_fields)))
        tmpdir = Path(tempfile.mkdtemp(prefix=f".{stem}.search-", dir=ctx.workdir))
        try:
            src = artifact
            if config.preprocess:  # once, so that node names are the same in every trial
                from onnxruntime.quantization.shape_inference import quant_pre_process

                pre = tmpdir / "pre.onnx"
                with quiet("root", "onnxruntime"):
                    quant_pre_process(str(artifact.path), str(pre), skip_symbolic_shape=True)
                src = Artifact.from_file(pre, Format.ONNX, artifact.io)
            preprocess_note = None
            try:
                base_acc, _ = scorer(Path(src.path))
            except Exception as exc:  # onnxruntime's errors derive from Exception
                if src is artifact:
                    raise PassError(f"onnxruntime cannot run the fp32 model: {str(exc).splitlines()[0][:300]}") from exc
                # quant_pre_process can emit a graph onnxruntime refuses (seen on a transformers BERT:
                # "Attempt to replace the existing tensor"): quantize the model as it is instead
                preprocess_note = f"skipped: onnxruntime refused the pre-processed graph ({str(exc).splitlines()[0][:200]})"
                src = artifact
                base_acc, _ = scorer(Path(src.path))
            tol = tolerance_points(config.max_accuracy_drop, config.relative, abs(base_acc))
            graph = onnx.load(str(src.path)).graph
            allowed = set(config.op_types) if config.op_types else quantizable_ops()
            user_excluded = set(config.nodes_to_exclude)
            op_type = {nd.name: nd.op_type for nd in graph.node}
            candidates = [nd.name for nd in graph.node
                          if nd.op_type in allowed and nd.name and nd.name not in user_excluded]
            search = _Search(src, base_cfg, ctx, tmpdir, scorer, user_excluded, config.max_trials)

            kept: list[str] = []
            acc, mse, path = search.trial(kept)
            full = {"accuracy": _r(scorer.value(acc)), "drop": _r(base_acc - acc), "output_mse": _r(mse)}
            decisions: list[dict] = []
            sensitivity: list[dict] | None = None
            order: list[str] | None = None
            while base_acc - acc > tol:
                remaining = [c for c in candidates if c not in kept]
                limit_hit = config.max_float_ops is not None and len(kept) >= config.max_float_ops
                if not remaining or limit_hit or search.exhausted:
                    why = ("max_float_ops reached" if limit_hit else "trial budget (max_trials) spent"
                           if search.exhausted else "every quantizable op is already in float")
                    mname = scorer.metric.label()
                    raise PassError(
                        f"no INT8 configuration met the tolerance of {tol:.4g} ({mname}; {why}): the best "
                        f"found keeps {search.best[1] or 'no op'} in float and drops {base_acc - search.best[0]:.4g} "
                        f"(fp32 {_g(scorer.value(base_acc))}, full INT8 {_g(full['accuracy'])}); "
                        "no model was written",
                        hint="raise --max-accuracy-drop, allow more float ops (max_float_ops), give more "
                        "representative calibration data, or ship the fp32 model")
                if order is None or config.strategy == "rerank":
                    scored = []
                    for c in remaining:
                        if search.exhausted:
                            break
                        a, m, _ = search.trial(kept + [c])
                        scored.append((a, -m, c))
                    scored.sort(key=lambda t: (t[0], t[1]), reverse=True)
                    if sensitivity is None:  # the first round is each op's own sensitivity
                        sensitivity = [{"node": c, "op_type": op_type[c], "accuracy_if_float": _r(scorer.value(a)),
                                        "recovers_points": _r(a - acc), "output_mse_if_float": _r(-m)}
                                       for a, m, c in scored]
                    order = [c for _, _, c in scored]
                if not order:
                    continue  # budget ran out during ranking: the check above reports it
                pick = order.pop(0)
                prev = acc
                acc, mse, path = search.trial(kept + [pick])
                kept.append(pick)
                decisions.append({
                    "node": pick, "op_type": op_type[pick], "accuracy": _r(scorer.value(acc)),
                    "drop": _r(base_acc - acc),
                    "reason": f"keeping {pick} ({op_type[pick]}) in float moved {scorer.metric.label()} "
                              f"{_g(scorer.value(prev))} -> {_g(scorer.value(acc))}, "
                              f"the largest recovery of the {len(remaining)} candidates tried",
                })
            out = ctx.workdir / f"{stem}.onnx"
            tmp = ctx.workdir / f".{stem}.partial.onnx"
            shutil.copyfile(path, tmp)
            tmp.replace(out)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        metrics = {
            "metric": scorer.metric.label(),
            "fp32_accuracy": round(scorer.value(base_acc), 4),
            "full_int8": full,
            "accuracy": round(scorer.value(acc), 4),
            "accuracy_drop": round(base_acc - acc, 4),
            "tolerance_points": round(tol, 4),
            "kept_in_float": decisions,
            "float_ops": sorted(user_excluded | set(kept)),
            "quantizable_ops": len(candidates),
            "sensitivity": sensitivity or [],
            "trials": search.trials,
            "failed_trials": search.failures[:20],
            **({"preprocess": preprocess_note} if preprocess_note else {}),
            "strategy": config.strategy,
            "eval_data": str(ctx.eval.path),
            "eval_samples": n,
            "output_mse": mse,
        }
        if ctx.calib is not None:
            metrics["calibration_data"] = str(ctx.calib.path)
        return PassOutput(path=out, precision="mixed" if kept or user_excluded else "int8", metrics=metrics)


def _r(x: float | None) -> float | None:
    """Rounded for the lineage; a failed trial's infinities become null (JSON has no infinity)."""
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


def _g(x: float | None) -> str:
    return "n/a (onnxruntime could not run it)" if x is None else f"{x:.4g}"


class _Search:
    """Quantize with a set of float ops and score it; results memoized by the set."""

    def __init__(self, src, base_cfg, ctx, tmpdir, scorer, user_excluded, max_trials):
        self.src, self.base_cfg, self.tmpdir, self.scorer = src, base_cfg, tmpdir, scorer
        self.user_excluded, self.max_trials = user_excluded, max_trials
        self.ctx = PassContext(workdir=tmpdir, calib=ctx.calib, eval=ctx.eval, train=ctx.train)
        self.memo: dict[frozenset, tuple[float, float, Path]] = {}
        self.best: tuple[float, list[str]] = (float("-inf"), [])
        self.failures: list[dict] = []  # trials whose model onnxruntime could not load or run

    @property
    def trials(self) -> int:
        return len(self.memo)

    @property
    def exhausted(self) -> bool:
        return len(self.memo) >= self.max_trials

    def trial(self, float_ops: list[str]) -> tuple[float, float, Path]:
        key = frozenset(float_ops)
        if key in self.memo:
            return self.memo[key]
        cfg = self.base_cfg.model_copy(update={"nodes_to_exclude": sorted(self.user_excluded | key),
                                               "preprocess": False})
        out = OrtQuantize().run(self.src, cfg, self.ctx, f"trial-{len(self.memo)}")
        try:
            acc, mse = self.scorer(out.path)
        except Exception as exc:  # a batch of trials: one failure becomes that trial's result
            # onnxruntime refuses some quantized graphs ("Attempt to replace the existing tensor" on a
            # transformer's shared initializer; its errors derive from Exception): unusable, never chosen
            acc, mse = float("-inf"), float("inf")
            self.failures.append({"float_ops": sorted(float_ops), "error": str(exc).splitlines()[0][:300]})
        self.memo[key] = (acc, mse, out.path)
        if acc > self.best[0]:
            self.best = (acc, sorted(float_ops))
        return self.memo[key]
