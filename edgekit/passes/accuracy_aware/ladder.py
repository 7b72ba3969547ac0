"""The accuracy-aware pass's PTQ ladder (``quantize.py`` documents the rungs): ``Scorer`` (the
deploy's metric of an ONNX file on the eval set), ``Trials`` (quantize with an encoding and a set of float
nodes, score it; memoized, every trial logged) and ``Ladder`` (rungs 1-4: full INT8, calibration, encoding,
mixed precision over the measured layer sensitivity). The QAT rung (``qat.py``) climbs it again on the
fine-tuned weights."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

from ...artifact import Artifact
from ...errors import PassError
from ...inputs.source import ort_once, ort_reference_all
from ...inputs.stateful import run as run_stream
from ...metrics import get_metric
from ...timeline import BudgetExceeded, check_deadline
from .. import sensitivity as sens
from ..base import PassContext
from ..quantize_ort import OrtQuantize, OrtQuantizeConfig, encoding_label

if TYPE_CHECKING:
    from .config import AccuracyAwareConfig

Result = tuple[OrtQuantizeConfig, frozenset[str], float, float, Path]  # (config, float nodes, accuracy, mse, file)


def quantizable_ops() -> set[str]:
    """Op types onnxruntime's static quantizer handles by default (QOperator and QDQ registries)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return set(QDQRegistry) | set(QLinearOpsRegistry)


class Scorer:
    """The deploy's metric (``ctx.metric_plan``; top-1 on the first output without one) of
    an ONNX file on the eval set, and its output MSE vs fp32 (the first model scored). ``__call__``
    returns (goodness, mse) where goodness is the metric value signed so that higher is better."""

    def __init__(self, xs: list[np.ndarray], y: np.ndarray | None, plan: Any = None, stream: Any = None):
        n = len(xs[0])
        self.n = n
        self.xs = xs
        self.stream = stream  # constant and state inputs (edgekit/inputs/stateful.py): fed as the deploy feeds them
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
        outs = (run_stream(ort_once(path)[0], self.xs, self.stream) if self.stream is not None
                else ort_reference_all(path)(self.xs))
        picked = [outs[i] for i in self.idx]
        value = self.metric.evaluate(picked, self.targets).value
        first = np.asarray(picked[0], dtype=np.float32)
        if self.ref is None:
            self.ref = first
        mse = float(np.mean((first - self.ref) ** 2))
        return self.sign * value, mse


class OutOfBudget(Exception):
    pass


class Trials:
    """Quantize with an encoding and a set of float nodes, score it; memoized; every trial logged."""

    def __init__(self, src: Artifact, ctx: PassContext, tmpdir: Path, user_excluded: set[str], max_trials: int):
        self.src, self.tmpdir, self.user_excluded, self.max_trials = src, tmpdir, user_excluded, max_trials
        self.ctx = PassContext(workdir=tmpdir, calib=ctx.calib, eval=ctx.eval, train=ctx.train)
        self.memo: dict[tuple, tuple[float, float, Path | None]] = {}
        self.log: list[dict] = []
        self.failures: list[dict] = []
        self.best: tuple[float, str, list[str]] = (float("-inf"), "", [])
        self.built: dict[tuple, Path] = {}

    @property
    def count(self) -> int:
        return len(self.log)

    def build(self, cfg: OrtQuantizeConfig, float_nodes: frozenset[str]) -> Path:
        key = (encoding_label(cfg), float_nodes)
        if key not in self.built:
            c = cfg.model_copy(update={"nodes_to_exclude": sorted(self.user_excluded | float_nodes),
                                       "preprocess": False})
            self.built[key] = OrtQuantize().run(self.src, c, self.ctx, f"trial-{len(self.built)}").path
        return self.built[key]

    def __call__(self, rung: str, cfg: OrtQuantizeConfig, float_nodes: frozenset[str], scorer: Scorer,
                 base: float) -> tuple[float, float, Path | None]:
        key = (encoding_label(cfg), float_nodes, scorer.n)
        if key in self.memo:
            return self.memo[key]
        if self.count >= self.max_trials:
            raise OutOfBudget
        check_deadline(f"trial {self.count + 1} ({rung})")  # the search's time budget stops the ladder here
        started = time.perf_counter()
        path: Path | None = None
        try:
            path = self.build(cfg, float_nodes)
            acc, mse = scorer(path)
        except PassError as exc:  # a batch of trials: one failure becomes that trial's result
            acc, mse = float("-inf"), float("inf")
            self.failures.append({"encoding": encoding_label(cfg), "float_ops": sorted(float_nodes),
                                  "error": str(exc).splitlines()[0][:300]})
        except Exception as exc:  # onnxruntime refuses some quantized graphs (its errors derive from Exception)
            acc, mse = float("-inf"), float("inf")
            self.failures.append({"encoding": encoding_label(cfg), "float_ops": sorted(float_nodes),
                                  "error": str(exc).splitlines()[0][:300]})
        self.memo[key] = (acc, mse, path)
        self.log.append({"rung": rung, "encoding": encoding_label(cfg), "float_ops": len(float_nodes),
                         "samples": scorer.n, "accuracy": rounded(scorer.value(acc)), "drop": rounded(base - acc),
                         "seconds": round(time.perf_counter() - started, 3)})
        if acc > self.best[0] and scorer.n == self.full_n:
            self.best = (acc, encoding_label(cfg), sorted(float_nodes))
        return self.memo[key]

    full_n = 0


class Ladder:
    """The rungs (see the module doc); ``run`` returns (config, float nodes, accuracy, mse, path) or None."""

    def __init__(self, trials: Trials, full: Scorer, screen: Scorer, base: float, base_screen: float,
                 tol: float, config: AccuracyAwareConfig):
        self.t, self.full, self.screen = trials, full, screen
        self.base, self.base_screen, self.tol = base, base_screen, tol
        self.config = config
        self.rungs: list[dict] = []
        self.rung = ""
        self.full_int8: dict = {}
        self.sensitivity_doc: dict = {}
        self.why = "every rung tried"
        self._units: dict[str, tuple[int, sens.Unit]] = {}

    def _ok(self, rung: str, cfg: OrtQuantizeConfig, nodes: Iterable[str], scorer: Scorer
            ) -> tuple[bool, tuple[float, float, Path | None]]:
        base = self.base if scorer is self.full else self.base_screen
        acc, mse, path = self.t(rung, cfg, frozenset(nodes), scorer, base)
        return base - acc <= self.tol, (acc, mse, path)

    def _rung(self, name: str, started: float, n0: int, result: str) -> None:
        self.rungs.append({"rung": name, "trials": self.t.count - n0,
                           "seconds": round(time.perf_counter() - started, 3), "result": result})

    def _confirmed(self, rung: str, cfg: OrtQuantizeConfig, nodes: Iterable[str]) -> Result | None:
        """Within the tolerance on the whole eval set: (config, nodes, acc, mse, path), else None."""
        ok, (acc, mse, path) = self._ok(rung, cfg, nodes, self.full)
        return (cfg, frozenset(nodes), acc, mse, path) if ok else None

    def run(self, encodings: list[OrtQuantizeConfig], methods: list[str], src: Artifact, candidates: set[str],
            tmpdir: Path) -> Result | None:
        fast = encodings[0]
        # 1 + 2: full INT8 in the fastest encoding, each calibration method
        t0, n0 = time.perf_counter(), self.t.count
        best_method, best_acc = methods[0], float("-inf")
        for i, m in enumerate(methods):
            cfg = fast.model_copy(update={"calibration_method": m})
            ok, (acc, mse, _) = self._ok("int8" if i == 0 else "calibration", cfg, (), self.full)
            if i == 0:
                self.full_int8 = {"encoding": encoding_label(cfg), "accuracy": rounded(self.full.value(acc)),
                                  "drop": rounded(self.base - acc), "output_mse": rounded(mse)}
                self._rung("int8", t0, n0, "within tolerance" if ok else "outside tolerance")
                t0, n0 = time.perf_counter(), self.t.count
            if acc > best_acc:
                best_method, best_acc = m, acc
            if ok:
                self.rung = "int8" if i == 0 else "calibration"
                if i:
                    self._rung("calibration", t0, n0, f"{m} within tolerance")
                return self._confirmed(self.rung, cfg, ())
        if len(methods) > 1:
            self._rung("calibration", t0, n0, f"none within tolerance (best: {best_method})")
        # 3: the device's next encodings, with the best calibration method
        t0, n0 = time.perf_counter(), self.t.count
        for enc in encodings[1:]:
            cfg = enc.model_copy(update={"calibration_method": best_method})
            ok, _ = self._ok("encoding", cfg, (), self.full)
            if ok:
                self.rung = "encoding"
                self._rung("encoding", t0, n0, f"{encoding_label(cfg)} within tolerance")
                return self._confirmed("encoding", cfg, ())
        if len(encodings) > 1:
            self._rung("encoding", t0, n0, "none within tolerance")
        # 4: mixed precision over the measured sensitivity
        self.rung = "mixed"
        if fast.mode == "dynamic":
            self.why = "mixed precision is measured on static INT8 (give --calib-data)"
            return None
        return self._mixed(fast.model_copy(update={"calibration_method": best_method}), src, candidates, tmpdir)

    def _mixed(self, cfg: OrtQuantizeConfig, src: Artifact, candidates: set[str], tmpdir: Path) -> Result | None:
        t0, n0 = time.perf_counter(), self.t.count
        qdq = cfg if cfg.format == "qdq" else cfg.model_copy(update={"format": "qdq"})
        try:
            qpath = self.t.build(qdq, frozenset())
            s = sens.measure(Path(src.path), qpath, list(self.full.xs), candidates, tmpdir,
                             samples=self.config.sensitivity_samples, output_idx=self.full.idx,
                             stream=self.full.stream)
        except BudgetExceeded:
            raise
        except Exception as exc:  # onnxruntime/onnx errors of many kinds: the rung fails, named
            self.why = (f"layer sensitivity could not be measured ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]})")
            self._rung("mixed", t0, n0, self.why)
            return None
        units = [u for u in s.units if u.nodes]
        self._units = {nd: (r, u) for r, u in reversed(list(enumerate(units))) for nd in u.nodes}
        self.sensitivity_doc = {"method": "each quantized tensor alone, relative output error vs fp32",
                                "samples": s.samples, "seconds": s.seconds, "units": len(units),
                                "all_quantized_error": rounded(s.all_quantized_error),
                                "most_sensitive": [u.as_dict() for u in units[:20]]}

        def nodes_of(k: int) -> set[str]:
            return {nd for u in units[:k] for nd in u.nodes}

        limit = self.config.max_float_ops
        result = None
        for scorer in ([self.screen, self.full] if self.screen is not self.full else [self.full]):
            k = self._smallest_prefix(cfg, units, nodes_of, scorer)
            if k is None:
                break
            nodes = self._prune(cfg, units[:k], scorer)
            if limit is not None and len(nodes) > limit:
                self.why = f"max_float_ops reached ({len(nodes)} ops in float needed, max_float_ops {limit})"
                self._best_within_limit(cfg, units, limit)
                self._rung("mixed", t0, n0, self.why)
                return None
            result = self._confirmed("mixed", cfg, nodes)
            if result is not None:
                break
        self._rung("mixed", t0, n0, f"{len(result[1])} ops in float" if result else self.why)
        return result

    def _smallest_prefix(self, cfg: OrtQuantizeConfig, units: list[sens.Unit], nodes_of: Callable[[int], set[str]],
                         scorer: Scorer) -> int | None:
        """The smallest k whose first k units in float meet the tolerance (galloping, then bisection)."""
        lo, hi, k = 0, None, 1
        while k < len(units):
            if self._ok("mixed", cfg, nodes_of(k), scorer)[0]:
                hi = k
                break
            lo, k = k, k * 2
        if hi is None:
            if units and self._ok("mixed", cfg, nodes_of(len(units)), scorer)[0]:
                hi = len(units)
            else:
                self.why = "even every measured unit in float stays outside the tolerance"
                return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._ok("mixed", cfg, nodes_of(mid), scorer)[0]:
                hi = mid
            else:
                lo = mid
        return hi

    def _prune(self, cfg: OrtQuantizeConfig, prefix: list[sens.Unit], scorer: Scorer, budget: int = 8) -> set[str]:
        """Drop each unit of the prefix (least sensitive first) whose float nodes the rest does not need."""
        keep = list(prefix)
        for u in reversed(prefix[:-1]):
            if budget <= 0:
                break
            rest = [v for v in keep if v is not u]
            nodes = {nd for v in rest for nd in v.nodes}
            if nodes == {nd for v in keep for nd in v.nodes}:
                keep = rest
                continue
            budget -= 1
            if self._ok("mixed", cfg, nodes, scorer)[0]:
                keep = rest
        return {nd for v in keep for nd in v.nodes}

    def _best_within_limit(self, cfg: OrtQuantizeConfig, units: list[sens.Unit], limit: int) -> None:
        """Score, on the whole eval set, the most sensitive units whose float nodes fit in max_float_ops,
        so that the error names the best configuration within the limit."""
        nodes: set[str] = set()
        for u in units:
            if len(nodes | set(u.nodes)) <= limit:
                nodes |= set(u.nodes)
        if nodes:
            self._ok("mixed", cfg, nodes, self.full)

    def reason(self, node: str, op_type: str) -> dict[str, Any]:
        rank, u = self._units.get(node, (None, None))
        if u is None:
            return {"node": node, "op_type": op_type, "reason": "kept in float"}
        return {"node": node, "op_type": op_type, "unit": u.tensor, "unit_kind": u.kind,
                "relative_output_error": float(f"{u.error:.4g}"), "sensitivity_rank": rank + 1,
                "reason": f"quantizing {u.kind} {u.tensor} alone moves the outputs by a relative error of "
                          f"{u.error:.3g} (rank {rank + 1}); keeping {node} ({op_type}) in float keeps it in float"}


def rounded(x: float | None) -> float | None:
    """Rounded for the lineage; a failed trial's infinities become null (JSON has no infinity)."""
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


def shown(x: float | None) -> str:
    return "n/a (onnxruntime could not run it)" if x is None else f"{x:.4g}"
