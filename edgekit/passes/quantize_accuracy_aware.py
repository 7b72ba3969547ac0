"""Accuracy-aware INT8 (onnxruntime): the fastest INT8 configuration that stays inside an accuracy
tolerance, found by a short ladder measured on the eval set -- never a silently degraded model.

The rungs, cheapest and fastest-running first; the first configuration inside the tolerance wins:
  1. ``int8``: full INT8 in the encoding the device runs fastest (``ENCODINGS``: for onnxruntime on
     x86 with VNNI, U8S8 QDQ per-tensor), calibrated by minmax.
  2. ``calibration``: the same encoding calibrated by percentile, then entropy.
  3. ``encoding``: the next encodings of the device's list (e.g. per-channel weights).
  4. ``mixed``: layer sensitivity measured once (``sensitivity.py``: each quantized tensor alone,
     its relative error on the outputs), then the fewest most-sensitive nodes kept in float
     (``nodes_to_exclude``): a galloping search then bisection over the sensitivity order, scored on
     ``screen_samples`` eval samples first and confirmed on the whole eval set, then each kept unit
     dropped again when the rest suffices.
Calibration ranges are computed once per method and reused by every trial (``quantize_ort``).
Every trial (rung, encoding, float nodes, accuracy, seconds) is in the lineage; when no
configuration meets the tolerance the pass raises PassError naming the best one found.

Fields set explicitly in the config (``format``, ``per_channel``, ``activation_type``,
``weight_type``, ``reduce_range``, ``calibration_method``) pin that part of the encoding; the rest
comes from ``ENCODINGS``.

Note: the search is scored on the eval set it is given; the device measures on the same set, so
give a held-out split as ``--eval-data`` if the reported accuracy must be unbiased.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from ..artifact import Artifact
from ..errors import DataError, PassError
from ..formats import Format
from ..logs import quiet
from . import sensitivity as sens
from .base import Pass, PassContext, PassOutput
from .quantize_ort import CalibrationMethodName, OrtQuantize, OrtQuantizeConfig, encoding_label

Device = Literal["host", "x86-vnni", "x86-avx2", "arm64"]

# Encodings per device kind, fastest first: (format, activation_type, weight_type, per_channel, reduce_range).
ENCODINGS: dict[str, tuple[tuple[str, str, str, bool, bool], ...]] = {
    # measured here (Intel Xeon with AVX-512 VNNI, onnxruntime 1.32, 1 thread, the zoo's MobileNetV2 at 64x64,
    # median thread CPU time; benchmarks/int8_ladder.py): U8S8 QDQ or QOperator, per-tensor or per-channel,
    # 1.03-1.13x fp32; S8S8 QDQ 0.53-0.65x (slower than fp32); S8S8 QOperator 0.20x. On the zoo's LeViT
    # QOperator U8S8 beat QDQ U8S8 (0.70x vs 0.61x; INT8 slower than fp32 there), hence the host speed probe.
    "x86-vnni": (("qdq", "uint8", "int8", False, False), ("qdq", "uint8", "int8", True, False),
                 ("qoperator", "uint8", "int8", False, False)),
    # not measured here: onnxruntime's quantization guide -- U8S8 on AVX2/AVX-512 without VNNI can saturate
    # (VPMADDUBSW), 7-bit weights (reduce_range) avoid it
    "x86-avx2": (("qdq", "uint8", "int8", False, True), ("qdq", "uint8", "int8", True, True)),
    # not measured here: onnxruntime's guide -- S8S8 QDQ per-channel is the recommended default on ARM64
    "arm64": (("qdq", "int8", "int8", True, False), ("qdq", "uint8", "int8", True, False)),
}
ENCODING_SOURCES = {
    "x86-vnni": "measured here (Intel Xeon, AVX-512 VNNI, onnxruntime 1.32; benchmarks/int8_ladder.py)",
    "x86-avx2": "onnxruntime quantization guide (U8S8 saturation without VNNI; reduce_range); not measured here",
    "arm64": "onnxruntime quantization guide (S8S8 QDQ recommended); not measured here",
}
_PINNABLE = ("format", "activation_type", "weight_type", "per_channel", "reduce_range")


class AccuracyAwareConfig(OrtQuantizeConfig):
    max_accuracy_drop: float = Field(1.0, ge=0, le=100, description="accuracy points vs fp32 (1 = one point)")
    relative: bool = Field(False, description="read max_accuracy_drop as percent of the fp32 accuracy")
    device: Device = Field("host", description="whose encoding table to start from (host: read this CPU's flags)")
    calibration_methods: list[CalibrationMethodName] = Field(
        default_factory=lambda: ["minmax", "percentile", "entropy"],
        description="the calibration rung, in order (calibration_method set explicitly: only that one)")
    max_float_ops: int | None = Field(None, ge=0, description="give up rather than keep more ops than this in float")
    max_trials: int = Field(60, ge=1, description="quantize+evaluate budget of the search")
    eval_samples: int | None = Field(None, ge=1, description="score on the first N eval samples (default all)")
    screen_samples: int = Field(256, ge=1, description="eval samples the mixed-precision search scores on "
                                "before confirming on all of them")
    sensitivity_samples: int = Field(32, ge=1, description="eval samples the layer sensitivity is measured on")
    speed_probe: bool = Field(True, description="device 'host': order the encodings by their measured speed on "
                              "this CPU (full INT8 builds, thread CPU time, ~1 s) instead of the table's order")


def tolerance_points(max_drop: float, relative: bool, base_accuracy: float) -> float:
    """The tolerance in accuracy points (``relative`` reads ``max_drop`` as percent of the baseline)."""
    return max_drop * base_accuracy / 100.0 if relative else max_drop


def quantizable_ops() -> set[str]:
    """Op types onnxruntime's static quantizer handles by default (QOperator and QDQ registries)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return set(QDQRegistry) | set(QLinearOpsRegistry)


def host_device() -> str:
    """This CPU's row of ``ENCODINGS`` (x86 with VNNI, x86 without, or arm64)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    return "x86-vnni" if ("avx512_vnni" in flags or "avx_vnni" in flags) else "x86-avx2"


def encodings_for(config: AccuracyAwareConfig) -> tuple[str, list[OrtQuantizeConfig]]:
    """(device kind, the encodings to try fastest first), explicitly set fields pinned."""
    device = host_device() if config.device == "host" else config.device
    base = OrtQuantizeConfig(**config.model_dump(include=set(OrtQuantizeConfig.model_fields)))
    if config.mode == "dynamic":  # weights only: no calibration, no activation encoding to choose
        return device, [base.model_copy(update={"preprocess": False})]
    pinned = {k: getattr(config, k) for k in _PINNABLE if k in config.model_fields_set}
    out: list[OrtQuantizeConfig] = []
    for fmt, act, w, pc, rr in ENCODINGS[device]:
        upd = {"format": fmt, "activation_type": act, "weight_type": w, "per_channel": pc, "reduce_range": rr,
               **pinned, "mode": "static", "preprocess": False}
        cfg = base.model_copy(update=upd)
        if all(encoding_label(cfg) != encoding_label(o) for o in out):
            out.append(cfg)
    return device, out


class _Scorer:
    """The deploy's metric (``ctx.extras["metric_plan"]``; top-1 on the first output without one) of
    an ONNX file on the eval set, and its output MSE vs fp32 (the first model scored). ``__call__``
    returns (goodness, mse) where goodness is the metric value signed so that higher is better."""

    def __init__(self, xs: list[np.ndarray], y: np.ndarray | None, plan=None):
        from ..metrics import get_metric

        n = len(xs[0])
        self.n = n
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


class _OutOfBudget(Exception):
    pass


class _Trials:
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
            c = cfg.model_copy(update={"nodes_to_exclude": sorted(self.user_excluded | float_nodes), "preprocess": False})
            self.built[key] = OrtQuantize().run(self.src, c, self.ctx, f"trial-{len(self.built)}").path
        return self.built[key]

    def __call__(self, rung: str, cfg: OrtQuantizeConfig, float_nodes: frozenset[str], scorer: _Scorer,
                 base: float) -> tuple[float, float, Path | None]:
        key = (encoding_label(cfg), float_nodes, scorer.n)
        if key in self.memo:
            return self.memo[key]
        if self.count >= self.max_trials:
            raise _OutOfBudget
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
                         "samples": scorer.n, "accuracy": _r(scorer.value(acc)), "drop": _r(base - acc),
                         "seconds": round(time.perf_counter() - started, 3)})
        if acc > self.best[0] and scorer.n == self.full_n:
            self.best = (acc, encoding_label(cfg), sorted(float_nodes))
        return self.memo[key]

    full_n = 0


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
        if config.mode == "static" and ctx.calib is None:
            raise DataError("static INT8 quantization needs a calibration set",
                            hint="pass --calib-data CALIB.npz (or use mode: dynamic in the recipe)")
        started = time.perf_counter()
        n = config.eval_samples or ctx.eval.n
        full = _Scorer([x[:n] for x in ctx.eval.xs], ctx.eval.y, plan)
        screen = (_Scorer([x[:config.screen_samples] for x in ctx.eval.xs], ctx.eval.y, plan)
                  if config.screen_samples < n else full)
        device, encodings = encodings_for(config)
        methods = [config.calibration_method] if ("calibration_method" in config.model_fields_set
                                                  or config.mode == "dynamic") else \
            list(dict.fromkeys(config.calibration_methods or ["minmax"]))
        tmpdir = Path(tempfile.mkdtemp(prefix=f".{stem}.search-", dir=ctx.workdir))
        try:
            src, preprocess_note = self._preprocess(artifact, config, tmpdir, full, screen)
            base_acc, _ = full(Path(src.path))
            base_screen = screen(Path(src.path))[0] if screen is not full else base_acc
            tol = tolerance_points(config.max_accuracy_drop, config.relative, abs(base_acc))
            graph = onnx.load(str(src.path)).graph
            allowed = set(config.op_types) if config.op_types else quantizable_ops()
            user_excluded = set(config.nodes_to_exclude)
            op_type = {nd.name: nd.op_type for nd in graph.node}
            candidates = {nd.name for nd in graph.node
                          if nd.op_type in allowed and nd.name and nd.name not in user_excluded}
            trials = _Trials(src, ctx, tmpdir, user_excluded, config.max_trials)
            trials.full_n = full.n
            search = _Ladder(trials, full, screen, base_acc, base_screen, tol, config)
            probe = None
            if config.speed_probe and config.device == "host" and len(encodings) > 1 and config.mode == "static":
                encodings, probe = _speed_probe(trials, encodings, methods[0], src, full.xs)
            try:
                chosen = search.run(encodings, methods, src, candidates, tmpdir)
            except _OutOfBudget:
                chosen = None
                search.why = "trial budget (max_trials) spent"
            if chosen is None:
                best_acc, best_enc, best_nodes = trials.best
                mname = full.metric.label()
                raise PassError(
                    f"no INT8 configuration met the tolerance of {tol:.4g} ({mname}; {search.why}): the best "
                    f"found keeps {best_nodes or 'no op'} in float ({best_enc or 'no encoding ran'}) and drops "
                    f"{base_acc - best_acc:.4g} (fp32 {_g(full.value(base_acc))}, full INT8 "
                    f"{_g(search.full_int8.get('accuracy'))}); no model was written",
                    hint="raise --max-accuracy-drop, allow more float ops (max_float_ops), give more "
                    "representative calibration data, or ship the fp32 model")
            cfg, nodes, acc, mse, path = chosen
            out = ctx.workdir / f"{stem}.onnx"
            tmp = ctx.workdir / f".{stem}.partial.onnx"
            shutil.copyfile(path, tmp)
            tmp.replace(out)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        kept = sorted(nodes)
        metrics = {
            "metric": full.metric.label(),
            "fp32_accuracy": round(full.value(base_acc), 4),
            "full_int8": search.full_int8,
            "accuracy": round(full.value(acc), 4),
            "accuracy_drop": round(base_acc - acc, 4),
            "tolerance_points": round(tol, 4),
            "encoding": encoding_label(cfg),
            "rung": search.rung,
            "device": device,
            "encoding_source": ENCODING_SOURCES[device],
            "encodings_tried": [encoding_label(e) for e in encodings],
            **({"speed_probe": probe} if probe else {}),
            "kept_in_float": [search.reason(nd, op_type.get(nd, "?")) for nd in kept],
            "float_ops": sorted(user_excluded | set(kept)),
            "quantizable_ops": len(candidates),
            "sensitivity": search.sensitivity_doc,
            "trials": trials.count,
            "trial_log": trials.log[:80],
            "rungs": search.rungs,
            "failed_trials": trials.failures[:20],
            "seconds": round(time.perf_counter() - started, 3),
            **({"preprocess": preprocess_note} if preprocess_note else {}),
            "eval_data": str(ctx.eval.path),
            "eval_samples": n,
            "screen_samples": screen.n,
            "output_mse": mse,
            **({"calibration_data": str(ctx.calib.path)} if ctx.calib is not None else {}),
        }
        return PassOutput(path=out, precision="mixed" if kept or user_excluded else "int8", metrics=metrics)

    @staticmethod
    def _preprocess(artifact, config, tmpdir: Path, full: _Scorer, screen: _Scorer):
        if not config.preprocess:
            return artifact, None
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = tmpdir / "pre.onnx"
        try:  # once, so that node names are the same in every trial
            with quiet("root", "onnxruntime"):
                quant_pre_process(str(artifact.path), str(pre), skip_symbolic_shape=True)
            src = Artifact.from_file(pre, Format.ONNX, artifact.io)
            full(Path(src.path))
            if screen is not full:
                screen(Path(src.path))
            return src, None
        except Exception as exc:  # onnxruntime's errors derive from Exception
            # quant_pre_process can emit a graph onnxruntime refuses (seen on a transformers BERT:
            # "Attempt to replace the existing tensor"): quantize the model as it is instead
            full.ref = screen.ref = None
            try:
                full(Path(artifact.path))
            except Exception as exc2:
                raise PassError(f"onnxruntime cannot run the fp32 model: {str(exc2).splitlines()[0][:300]}") from exc2
            full.ref = None
            return artifact, f"skipped: onnxruntime refused the pre-processed graph ({str(exc).splitlines()[0][:200]})"


class _Ladder:
    """The rungs (see the module doc); ``run`` returns (config, float nodes, accuracy, mse, path) or None."""

    def __init__(self, trials: _Trials, full: _Scorer, screen: _Scorer, base: float, base_screen: float,
                 tol: float, config: AccuracyAwareConfig):
        self.t, self.full, self.screen, self.base, self.base_screen, self.tol = trials, full, screen, base, base_screen, tol
        self.config = config
        self.rungs: list[dict] = []
        self.rung = ""
        self.full_int8: dict = {}
        self.sensitivity_doc: dict = {}
        self.why = "every rung tried"
        self._units: dict[str, tuple[int, sens.Unit]] = {}

    def _ok(self, rung, cfg, nodes, scorer) -> tuple[bool, tuple]:
        base = self.base if scorer is self.full else self.base_screen
        acc, mse, path = self.t(rung, cfg, frozenset(nodes), scorer, base)
        return base - acc <= self.tol, (acc, mse, path)

    def _rung(self, name: str, started: float, n0: int, result: str) -> None:
        self.rungs.append({"rung": name, "trials": self.t.count - n0, "seconds": round(time.perf_counter() - started, 3),
                           "result": result})

    def _confirmed(self, rung, cfg, nodes):
        """Within the tolerance on the whole eval set: (config, nodes, acc, mse, path), else None."""
        ok, (acc, mse, path) = self._ok(rung, cfg, nodes, self.full)
        return (cfg, frozenset(nodes), acc, mse, path) if ok else None

    def run(self, encodings, methods, src, candidates: set[str], tmpdir: Path):
        fast = encodings[0]
        # 1 + 2: full INT8 in the fastest encoding, each calibration method
        t0, n0 = time.perf_counter(), self.t.count
        best_method, best_acc = methods[0], float("-inf")
        for i, m in enumerate(methods):
            cfg = fast.model_copy(update={"calibration_method": m})
            ok, (acc, mse, _) = self._ok("int8" if i == 0 else "calibration", cfg, (), self.full)
            if i == 0:
                self.full_int8 = {"encoding": encoding_label(cfg), "accuracy": _r(self.full.value(acc)),
                                  "drop": _r(self.base - acc), "output_mse": _r(mse)}
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

    def _mixed(self, cfg: OrtQuantizeConfig, src, candidates: set[str], tmpdir: Path):
        t0, n0 = time.perf_counter(), self.t.count
        qdq = cfg if cfg.format == "qdq" else cfg.model_copy(update={"format": "qdq"})
        try:
            qpath = self.t.build(qdq, frozenset())
            s = sens.measure(Path(src.path), qpath, list(self.full.xs), candidates, tmpdir,
                             samples=self.config.sensitivity_samples, output_idx=self.full.idx)
        except Exception as exc:  # onnxruntime/onnx errors of many kinds: the rung fails, named
            self.why = f"layer sensitivity could not be measured ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            self._rung("mixed", t0, n0, self.why)
            return None
        units = [u for u in s.units if u.nodes]
        self._units = {nd: (r, u) for r, u in reversed(list(enumerate(units))) for nd in u.nodes}
        self.sensitivity_doc = {"method": "each quantized tensor alone, relative output error vs fp32",
                                "samples": s.samples, "seconds": s.seconds, "units": len(units),
                                "all_quantized_error": _r(s.all_quantized_error),
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

    def _smallest_prefix(self, cfg, units, nodes_of, scorer) -> int | None:
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

    def _prune(self, cfg, prefix: list[sens.Unit], scorer, budget: int = 8) -> set[str]:
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

    def _best_within_limit(self, cfg, units, limit: int) -> None:
        """Score, on the whole eval set, the most sensitive units whose float nodes fit in max_float_ops,
        so that the error names the best configuration within the limit."""
        nodes: set[str] = set()
        for u in units:
            if len(nodes | set(u.nodes)) <= limit:
                nodes |= set(u.nodes)
        if nodes:
            self._ok("mixed", cfg, nodes, self.full)

    def reason(self, node: str, op_type: str) -> dict:
        rank, u = self._units.get(node, (None, None))
        if u is None:
            return {"node": node, "op_type": op_type, "reason": "kept in float"}
        return {"node": node, "op_type": op_type, "unit": u.tensor, "unit_kind": u.kind,
                "relative_output_error": float(f"{u.error:.4g}"), "sensitivity_rank": rank + 1,
                "reason": f"quantizing {u.kind} {u.tensor} alone moves the outputs by a relative error of "
                          f"{u.error:.3g} (rank {rank + 1}); keeping {node} ({op_type}) in float keeps it in float"}


def _speed_probe(trials: _Trials, encodings: list[OrtQuantizeConfig], method: str, src: Artifact,
                 xs: list[np.ndarray]) -> tuple[list[OrtQuantizeConfig], dict]:
    """The encodings ordered by the median thread CPU time per inference of their full-INT8 builds on
    this host (onnxruntime, 1 thread, alternating rounds: CPU time does not count other jobs holding the
    core), with fp32 measured beside them."""
    import onnxruntime as ort

    started = time.perf_counter()
    cfgs = [e.model_copy(update={"calibration_method": method}) for e in encodings]
    paths: dict[str, Path] = {"fp32": Path(src.path)}
    for c in cfgs:
        try:
            paths[encoding_label(c)] = trials.build(c, frozenset())
        except PassError:
            continue  # the ladder meets the failure again and records it
    sessions = {}
    for name, p in paths.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        try:
            sess = ort.InferenceSession(str(p), sess_options=so, providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime cannot load this build: the ladder's trial records why
            continue
        ins = sess.get_inputs()
        feed = {i.name: np.ascontiguousarray(np.asarray(x[:1]).astype(_np_type(i.type), copy=False))
                for i, x in zip(ins, xs)}
        if any(isinstance(d, int) and d > 1 for i in ins for d in i.shape[:1]):
            continue  # a static batch above 1: not probed
        sessions[name] = (sess, feed)
    if "fp32" not in sessions or len(sessions) < 3:
        return encodings, {}
    t = time.thread_time()
    for sess, feed in sessions.values():
        sess.run(None, feed)
    per_round = max(1, min(50, int(0.02 / max((time.thread_time() - t) / len(sessions), 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(7):
        for n, (sess, feed) in sessions.items():
            t = time.thread_time()
            for _ in range(per_round):
                sess.run(None, feed)
            times[n].append((time.thread_time() - t) / per_round * 1000)
    ms = {n: float(np.median(v)) for n, v in times.items()}
    rank = {encoding_label(c): ms.get(encoding_label(c), float("inf")) for c in cfgs}
    ordered = [e for _, e in sorted(zip(cfgs, encodings), key=lambda ce: rank[encoding_label(ce[0])])]
    fastest = min(rank.values())
    doc = {"cpu_ms": {n: round(v, 4) for n, v in ms.items()}, "seconds": round(time.perf_counter() - started, 3),
           "int8_speedup": round(ms["fp32"] / fastest, 3) if np.isfinite(fastest) else None}
    if np.isfinite(fastest) and fastest > ms["fp32"]:
        doc["note"] = (f"INT8 is slower than fp32 on this host (x{ms['fp32'] / fastest:.2f} at best): "
                       "ship fp32 here unless the device differs")
    return ordered, doc


def _np_type(ort_type: str):
    return {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
            "tensor(bool)": np.bool_, "tensor(float16)": np.float16}.get(ort_type, np.float32)


def _r(x: float | None) -> float | None:
    """Rounded for the lineage; a failed trial's infinities become null (JSON has no infinity)."""
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


def _g(x: float | None) -> str:
    return "n/a (onnxruntime could not run it)" if x is None else f"{x:.4g}"
