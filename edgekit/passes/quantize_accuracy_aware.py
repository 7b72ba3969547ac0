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
  5. ``qat``: with train data (``--train-data``) and the PyTorch model, when no configuration above met
     the tolerance, or mixed precision met it only with more than ``qat.above_float_fraction`` of the
     ops in float: quantization-aware fine-tuning (``quantize_qat.py``: fake-quant fine-tuning that
     mirrors onnxruntime's static INT8, the fp32 model as distillation teacher), then rungs 1-4 again on
     the fine-tuned weights, scored against the original fp32 model (a mixed result must keep fewer
     ops in float than the PTQ one). Without train data the failure message says QAT needs it.
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
from ..host import cpu_flags
from ..errors import DataError, PassError
from ..formats import Format
from ..logs import quiet
from ..timeline import BudgetExceeded, check_deadline
from . import sensitivity as sens
from .base import Pass, PassContext, PassOutput
from .quantize_ort import CalibrationMethodName, OrtQuantize, OrtQuantizeConfig, _stream_note, encoding_label
from .quantize_qat import QatSettings

Device = Literal["host", "x86-vnni", "x86-avx2", "arm64"]

# Encodings per device kind, fastest first: (format, activation_type, weight_type, per_channel, reduce_range).
ENCODINGS: dict[str, tuple[tuple[str, str, str, bool, bool], ...]] = {
    # measured here (Intel Xeon with AVX-512 VNNI, onnxruntime 1.32, 1 thread, the zoo's MobileNetV2 at 64x64,
    # median thread CPU time; benchmarks/int8_ladder.py): U8S8 QDQ or QOperator, per-tensor or per-channel,
    # 1.03-1.13x fp32; S8S8 QDQ 0.53-0.65x (slower than fp32); S8S8 QOperator 0.20x. On the zoo's LeViT
    # QOperator U8S8 beat QDQ U8S8 (0.70x vs 0.61x; INT8 slower than fp32 there), hence the host speed probe.
    # QOperator U8S8 per-tensor comes first: in benchmarks/compression_table.py (agent p50, 1 thread) it was
    # never slower than QDQ U8S8 per-tensor and faster on three of four models (the perf-style MobileNetV2
    # 0.388 vs 0.400 ms, LeViT 0.222 vs 0.246, Wav2Vec2 1.48 vs 1.55; the zoo MobileNetV2 a tie), so it wins
    # the probe's ties (PROBE_TIE).
    "x86-vnni": (("qoperator", "uint8", "int8", False, False), ("qdq", "uint8", "int8", False, False),
                 ("qdq", "uint8", "int8", True, False)),
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
# the speed probe's tie band: encodings within it of the fastest keep the device table's order (its
# first entry was measured faster on the device where the probe's host timing cannot tell them apart)
PROBE_TIE = 0.03
_PINNABLE = ("format", "activation_type", "weight_type", "per_channel", "reduce_range")


class QatRung(QatSettings):
    """The QAT rung's settings (``qat:`` in the pass config; the fine-tune's own fields are
    ``quantize_qat.QatSettings``)."""

    enabled: bool = Field(True, description="with train data, fine-tune under simulated INT8 when PTQ misses")
    above_float_fraction: float = Field(0.25, ge=0, le=1, description="also try QAT when mixed precision meets the "
                                        "tolerance only by keeping more than this fraction of the quantizable ops in "
                                        "float (1: only when PTQ fails); the QAT model wins with fewer float ops")


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
    qat: QatRung = Field(default_factory=QatRung, description="the quantization-aware fine-tuning rung (needs train "
                         "data and the PyTorch model)")


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
    return "x86-vnni" if cpu_flags() & {"avx512_vnni", "avx_vnni"} else "x86-avx2"


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

    def __init__(self, xs: list[np.ndarray], y: np.ndarray | None, plan=None, stream=None):
        from ..metrics import get_metric

        n = len(xs[0])
        self.n = n
        self.xs = xs
        self.stream = stream  # constant and state inputs (edgekit/stateful.py): fed as the deploy feeds them
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
        from ..source import ort_once, ort_reference_all
        from ..stateful import run as run_stream

        outs = (run_stream(ort_once(path)[0], self.xs, self.stream) if self.stream is not None
                else ort_reference_all(path)(self.xs))
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
        qat_source, qat_skip = _qat_source(artifact, config, ctx)
        qat_train, bad_train = _qat_train(qat_source, config, ctx)
        qat_skip = qat_skip or bad_train
        started = time.perf_counter()
        n = config.eval_samples or ctx.eval.n
        stream = getattr(ctx.eval, "stream", None)  # a stream is scored from its start: first-N subsets
        full = _Scorer([x[:n] for x in ctx.eval.xs], ctx.eval.y, plan, stream)
        screen = (_Scorer([x[:config.screen_samples] for x in ctx.eval.xs], ctx.eval.y, plan, stream)
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
                encodings, probe = _speed_probe(trials, encodings, methods[0], src, full.xs, stream)
            try:
                chosen = search.run(encodings, methods, src, candidates, tmpdir)
            except _OutOfBudget:
                chosen = None
                search.why = "trial budget (max_trials) spent"
            # 5: quantization-aware fine-tuning when PTQ missed (or needed too many float ops) and train data is here
            qat = _QatRung(config, ctx, qat_source, qat_skip, qat_train, full, screen, base_acc, base_screen, tol, tmpdir)
            won = qat.maybe_run(chosen, search, trials, candidates, encodings, methods, user_excluded)
            if won is not None:
                chosen = won
            if chosen is None:
                best_acc, best_enc, best_nodes = max(trials.best, qat.best, key=lambda b: b[0])
                mname = full.metric.label()
                raise PassError(
                    f"no INT8 configuration met the tolerance of {tol:.4g} ({mname}; {search.why}{qat.note()}): the "
                    f"best found keeps {best_nodes or 'no op'} in float ({best_enc or 'no encoding ran'}) and drops "
                    f"{base_acc - best_acc:.4g} (fp32 {_g(full.value(base_acc))}, full INT8 "
                    f"{_g(search.full_int8.get('accuracy'))}); no model was written",
                    hint="raise --max-accuracy-drop, allow more float ops (max_float_ops), give more "
                    "representative calibration data, " + ("give --train-data TRAIN.npz (inputs and labels) for "
                    "quantization-aware fine-tuning, " if qat.wants_train_data else "") + "or ship the fp32 model")
            cfg, nodes, acc, mse, path = chosen
            out = ctx.workdir / f"{stem}.onnx"
            tmp = ctx.workdir / f".{stem}.partial.onnx"
            shutil.copyfile(path, tmp)
            tmp.replace(out)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        kept = sorted(nodes)
        ladder, op_type = (qat.ladder, qat.op_type) if won is not None else (search, op_type)
        metrics = {
            "metric": full.metric.label(),
            "fp32_accuracy": round(full.value(base_acc), 4),
            "full_int8": search.full_int8,
            "accuracy": round(full.value(acc), 4),
            "accuracy_drop": round(base_acc - acc, 4),
            "tolerance_points": round(tol, 4),
            "encoding": encoding_label(cfg),
            "rung": "qat" if won is not None else search.rung,
            "device": device,
            "encoding_source": ENCODING_SOURCES[device],
            "encodings_tried": [encoding_label(e) for e in encodings],
            **({"speed_probe": probe} if probe else {}),
            "kept_in_float": [ladder.reason(nd, op_type.get(nd, "?")) for nd in kept],
            "float_ops": sorted((user_excluded if won is None else qat.user_excluded) | set(kept)),
            "quantizable_ops": len(candidates) if won is None else len(qat.candidates),
            "sensitivity": search.sensitivity_doc,
            "trials": trials.count + qat.trial_count,
            "trial_log": (trials.log + qat.trial_log)[:80],
            "rungs": search.rungs + qat.rungs,
            "failed_trials": (trials.failures + qat.failures)[:20],
            **({"qat": qat.doc} if qat.doc else {}),
            "seconds": round(time.perf_counter() - started, 3),
            **({"preprocess": preprocess_note} if preprocess_note else {}),
            "eval_data": str(ctx.eval.path),
            "eval_samples": n,
            "screen_samples": screen.n,
            "output_mse": mse,
            **({"calibration_data": str(ctx.calib.path)} if ctx.calib is not None else {}),
            **({"calibration_stream": _stream_note(ctx.calib.stream, ctx.calib.n)}
               if ctx.calib is not None and getattr(ctx.calib, "stream", None) is not None else {}),
            **({"train_data": str(ctx.train.path)} if qat.ran else {}),
        }
        return PassOutput(path=out, precision="mixed" if metrics["float_ops"] else "int8", metrics=metrics)

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
                             samples=self.config.sensitivity_samples, output_idx=self.full.idx,
                             stream=self.full.stream)
        except BudgetExceeded:
            raise
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


def _qat_source(artifact: Artifact, config: AccuracyAwareConfig, ctx: PassContext):
    """(the PyTorch source the input ONNX was exported from, None) or (None, why QAT cannot run)."""
    if not config.qat.enabled:
        return None, "qat.enabled is false"
    if config.mode != "static":
        return None, "QAT simulates static INT8 (give --calib-data)"
    src = ctx.extras.get("source")
    if getattr(src, "program", None) is None:
        return None, "QAT fine-tunes the PyTorch model and the source is not one (give the .pt2)"
    k = len(src.artifact.lineage)
    if tuple(artifact.lineage[:k]) != tuple(src.artifact.lineage) or any(
            st.kind == "pass" for st in artifact.lineage[k:]):
        return None, "the input is not the source model's own export (QAT fine-tunes the source program)"
    return src, None


def _qat_train(source, config: AccuracyAwareConfig, ctx: PassContext):
    """(the train data aligned to the source's inputs, None) or (None, why the rung cannot use it).
    Checked before any quantization time; not an error here: a deploy's train data may be meant for
    another pass (`edgekit quantize --train-data` refuses it itself)."""
    if source is None or ctx.train is None:
        return None, None
    from ..data import check_fits
    from .quantize_qat import task_of

    try:
        train = check_fits(ctx.train, source.artifact.io, "train")
        task_of(train, tuple(source.artifact.io.outputs[0].shape), config.qat.alpha)
    except DataError as exc:
        return None, f"the train data does not fit it ({exc.message})"
    return train, None


class _QatRung:
    """Quantization-aware fine-tuning (``quantize_qat``), then the PTQ rungs again on the fine-tuned
    weights, scored against the original fp32 model. Runs when no PTQ configuration met the tolerance,
    or when mixed precision met it only with more than ``qat.above_float_fraction`` of the ops in float
    (then the QAT model must keep fewer ops in float to win)."""

    def __init__(self, config: AccuracyAwareConfig, ctx: PassContext, source, skip: str | None, train,
                 full: _Scorer, screen: _Scorer, base: float, base_screen: float, tol: float, tmpdir: Path):
        self.config, self.ctx, self.source, self.skip, self.train = config, ctx, source, skip, train
        self.full, self.screen, self.base, self.base_screen, self.tol, self.tmpdir = full, screen, base, base_screen, tol, tmpdir
        self.doc: dict = {}
        self.rungs: list[dict] = []
        self.ran = False
        self.wants_train_data = False
        self.ladder: _Ladder | None = None
        self.trials: _Trials | None = None
        self.op_type: dict[str, str] = {}
        self.candidates: set[str] = set()
        self.user_excluded: set[str] = set()

    @property
    def best(self) -> tuple[float, str, list[str]]:
        return self.trials.best if self.trials is not None else (float("-inf"), "", [])

    @property
    def trial_count(self) -> int:
        return self.trials.count if self.trials is not None else 0

    @property
    def trial_log(self) -> list[dict]:
        return [{**t, "rung": f"qat/{t['rung']}"} for t in self.trials.log] if self.trials is not None else []

    @property
    def failures(self) -> list[dict]:
        return self.trials.failures if self.trials is not None else []

    def note(self) -> str:
        """What the failure message says about this rung."""
        if not self.doc:
            return ""
        if not self.ran:
            return f"; quantization-aware fine-tuning was not tried: {self.doc['skipped']}"
        return f"; quantization-aware fine-tuning: {self.rungs[-1]['result']}"

    def maybe_run(self, chosen, search: _Ladder, trials: _Trials, candidates: set[str], encodings, methods,
                  user_excluded: set[str]):
        """The QAT result (config, nodes, acc, mse, path) when it wins, else None."""
        frac = self.config.qat.above_float_fraction
        if chosen is None:
            why = "no PTQ configuration met the tolerance"
        elif search.rung == "mixed" and candidates and len(chosen[1]) > frac * len(candidates):
            why = (f"mixed precision met the tolerance only with {len(chosen[1])} of {len(candidates)} quantizable ops "
                   f"in float (more than qat.above_float_fraction {frac:g})")
        else:
            return None
        skip = self.skip or (None if self.ctx.train is not None else
                             "it needs --train-data TRAIN.npz (inputs and labels; train_data in a recipe)")
        if skip:
            self.wants_train_data = self.ctx.train is None and self.skip is None
            self.doc = {"why": why, "ran": False, "skipped": skip}
            return None
        self.ran = True
        started = time.perf_counter()
        try:
            result, doc = self._run(chosen, trials, encodings, methods, user_excluded)
        except (DataError, BudgetExceeded):
            raise
        except Exception as exc:  # a rung of the batch: torch/onnx failures of many kinds become its result
            result, doc = None, {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        within = result is not None
        outcome = (f"within tolerance ({self.ladder.rung}: {encoding_label(result[0])}, {len(result[1])} ops in float)"
                   if within else (f"failed ({doc['error']})" if "error" in doc else
                                   f"outside tolerance ({self.ladder.why}; best drop "
                                   f"{_g(self.base - self.best[0] if np.isfinite(self.best[0]) else None)})"))
        self.rungs.append({"rung": "qat", "trials": self.trial_count, "seconds": round(time.perf_counter() - started, 3),
                           "result": outcome, **{k: doc[k] for k in ("finetune_seconds", "export_seconds") if k in doc},
                           **({"ladder": self.ladder.rungs} if self.ladder is not None else {})})
        self.doc = {"why": why, "ran": True, "won": within, **doc}
        return result

    def _run(self, chosen, trials: _Trials, encodings, methods, user_excluded: set[str]):
        import onnx

        from ..source import load_onnx
        from ._torch import torch_threads
        from .quantize_qat import finetune, finetuned_onnx

        q, src = self.config.qat, self.source
        qdir = self.tmpdir / "qat"
        qdir.mkdir()
        t0 = time.perf_counter()
        # simulate the encoding whose full INT8 came closest (fine-tuning from a collapsed model, e.g. per-tensor
        # weights with outlier channels, does not recover in a few epochs); its ladder tries that one first
        enc = _closest_full_int8(trials, encodings, methods, self.full.n)
        encodings = [enc, *[e for e in encodings if encoding_label(e.model_copy(update={"calibration_method": "minmax"}))
                            != encoding_label(enc.model_copy(update={"calibration_method": "minmax"}))]]
        with torch_threads(q.threads):
            res = finetune(src.program, src.artifact.io, self.train, self.ctx.calib, q, enc)
            t1 = time.perf_counter()
            fp32 = finetuned_onnx(res, qdir / "finetuned.onnx", [x[:8] for x in self.full.xs])
        t2 = time.perf_counter()
        doc: dict = {"simulated": f"{encoding_label(enc)} (the closest full INT8 of the PTQ rungs)",
                     "finetune_seconds": round(t1 - t0, 3), "export_seconds": round(t2 - t1, 3),
                     "finetune": res.metrics, "finetuned_parity": (fp32.lineage[-1].metrics or {}).get("parity")}
        qsrc = load_onnx(Path(fp32.path)).artifact
        if self.config.preprocess:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            pre = qdir / "pre.onnx"
            try:
                with quiet("root", "onnxruntime"):
                    quant_pre_process(str(qsrc.path), str(pre), skip_symbolic_shape=True)
                ft_acc = self.full(pre)[0]  # onnxruntime runs it
                qsrc = Artifact.from_file(pre, Format.ONNX, qsrc.io)
            except Exception as exc:  # onnxruntime refuses some pre-processed graphs: quantize as exported
                doc["preprocess"] = f"skipped ({str(exc).splitlines()[0][:200]})"
                ft_acc = self.full(Path(qsrc.path))[0]
        else:
            ft_acc = self.full(Path(qsrc.path))[0]
        doc["finetuned_fp32_accuracy"] = _r(self.full.value(ft_acc))
        graph = onnx.load(str(qsrc.path)).graph
        self.op_type = {nd.name: nd.op_type for nd in graph.node}
        allowed = set(self.config.op_types) if self.config.op_types else quantizable_ops()
        self.user_excluded = user_excluded & set(self.op_type)
        if user_excluded - self.user_excluded:  # the fine-tuned model's export named those nodes otherwise
            doc["nodes_to_exclude_not_found"] = sorted(user_excluded - self.user_excluded)
        self.candidates = {nd.name for nd in graph.node
                           if nd.op_type in allowed and nd.name and nd.name not in self.user_excluded}
        limit = self.config.max_float_ops
        if chosen is not None:  # beat the mixed-precision result: fewer ops in float
            limit = len(chosen[1]) - 1 if limit is None else min(limit, len(chosen[1]) - 1)
        cfg = self.config.model_copy(update={"max_float_ops": limit})
        self.trials = _Trials(qsrc, self.ctx, qdir, self.user_excluded,
                              max(3, self.config.max_trials - trials.count))
        self.trials.full_n = self.full.n
        self.ladder = _Ladder(self.trials, self.full, self.screen, self.base, self.base_screen, self.tol, cfg)
        try:
            result = self.ladder.run(encodings, methods, qsrc, self.candidates, qdir)
        except _OutOfBudget:
            result = None
            self.ladder.why = "trial budget (max_trials) spent"
        if self.ladder.sensitivity_doc:
            doc["sensitivity"] = self.ladder.sensitivity_doc
        return result, doc


def _closest_full_int8(trials: _Trials, encodings: list[OrtQuantizeConfig], methods: list[str], n: int) -> OrtQuantizeConfig:
    """The encoding (with its calibration method) of the best full-INT8 trial on the whole eval set,
    else the fastest encoding."""
    by_label = {encoding_label(e.model_copy(update={"calibration_method": m})): e.model_copy(update={"calibration_method": m})
                for e in encodings for m in methods}
    scored = [(acc, label) for (label, nodes, samples), (acc, _, _) in trials.memo.items()
              if not nodes and samples == n and label in by_label and np.isfinite(acc)]
    return by_label[max(scored)[1]] if scored else encodings[0]


def _speed_probe(trials: _Trials, encodings: list[OrtQuantizeConfig], method: str, src: Artifact,
                 xs: list[np.ndarray], stream=None) -> tuple[list[OrtQuantizeConfig], dict]:
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
        first = [np.asarray(x[:1]) for x in xs]
        if stream is not None:  # every input: the constants, the state at zeros (by name: the model's order)
            by_name = dict(zip(stream.inputs, stream.feed(first, stream.zeros())))
            first = [by_name[i.name] for i in ins]
        feed = {i.name: np.ascontiguousarray(x.astype(_np_type(i.type), copy=False)) for i, x in zip(ins, first)}
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
    fastest = min(rank.values())
    # within PROBE_TIE of the fastest: a tie, kept in the device table's order (a stable sort)
    ordered = [e for _, e in sorted(zip(cfgs, encodings), key=lambda ce: (
        0.0 if rank[encoding_label(ce[0])] <= fastest * (1 + PROBE_TIE) else rank[encoding_label(ce[0])]))]
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
