"""Accuracy-aware INT8 (onnxruntime): the fastest INT8 configuration that stays inside an accuracy
tolerance, found by a short ladder measured on the eval set -- never a silently degraded model.

The rungs, cheapest and fastest-running first; the first configuration inside the tolerance wins:
  1. ``int8``: full INT8 in the encoding the device runs fastest (``config.ENCODINGS``: for onnxruntime on
     x86 with VNNI, U8S8 QDQ per-tensor), calibrated by minmax.
  2. ``calibration``: the same encoding calibrated by percentile, then entropy.
  3. ``encoding``: the next encodings of the device's list (e.g. per-channel weights).
  4. ``mixed``: layer sensitivity measured once (``passes/sensitivity.py``: each quantized tensor alone,
     its relative error on the outputs), then the fewest most-sensitive nodes kept in float
     (``nodes_to_exclude``): a galloping search then bisection over the sensitivity order, scored on
     ``screen_samples`` eval samples first and confirmed on the whole eval set, then each kept unit
     dropped again when the rest suffices.
  5. ``qat``: with train data (``--train-data``) and the PyTorch model, when no configuration above met
     the tolerance, or mixed precision met it only with more than ``qat.above_float_fraction`` of the
     ops in float: quantization-aware fine-tuning (``passes/quantize_qat.py``: fake-quant fine-tuning that
     mirrors onnxruntime's static INT8, the fp32 model as distillation teacher), then rungs 1-4 again on
     the fine-tuned weights, scored against the original fp32 model (a mixed result must keep fewer
     ops in float than the PTQ one). Without train data the failure message says QAT needs it.
Calibration ranges are computed once per method and reused by every trial (``passes/quantize_ort.py``).
Every trial (rung, encoding, float nodes, accuracy, seconds) is in the lineage; when no
configuration meets the tolerance the pass raises PassError naming the best one found.

Fields set explicitly in the config (``format``, ``per_channel``, ``activation_type``,
``weight_type``, ``reduce_range``, ``calibration_method``) pin that part of the encoding; the rest
comes from ``ENCODINGS``.
Where each part lives (imports run one way: config <- ladder <- qat <- quantize): ``quantize.py`` (this
module) the pass and the order of work; ``config.py`` its config and the encoding tables; ``ladder.py`` the
scorer, the trials and rungs 1-4; ``qat.py`` rung 5; ``measure/host_speed.py`` the host speed probe's
measurement (which orders the encodings on device 'host').

Note: the search is scored on the eval set it is given; the device measures on the same set, so
give a held-out split as ``--eval-data`` if the reported accuracy must be unbiased.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...artifact import Artifact
from ...errors import DataError, PassError
from ...formats import Format
from ...logs import quiet
from ...measure.host_speed import cpu_ms_per_inference, ort_sessions
from ..base import Pass, PassContext, PassOutput
from ..quantize_ort import OrtQuantizeConfig, encoding_label, stream_note
from .config import ENCODING_SOURCES, PROBE_TIE, AccuracyAwareConfig, encodings_for, tolerance_points
from .ladder import Ladder, OutOfBudget, Scorer, Trials, quantizable_ops, shown
from .qat import QatRunner, source_for_qat, train_for_qat


class AccuracyAwareQuantize(Pass):
    name = "quantize_accuracy_aware"
    Config = AccuracyAwareConfig
    input_formats = (Format.ONNX,)

    def run(self, artifact, config: AccuracyAwareConfig, ctx: PassContext, stem: str) -> PassOutput:
        import onnx

        if ctx.eval is None:
            raise DataError("accuracy-aware quantization needs an eval set",
                            hint="pass --eval-data EVAL.npz (inputs and labels), or use the plain `quantize` pass")
        plan = ctx.metric_plan
        if plan is None and ctx.eval.y is None:
            raise DataError(f"eval data {ctx.eval.path} has no labels; accuracy-aware quantization scores top-1 "
                            "on them",
                            hint="add y=labels to the .npz, or deploy with a metric that needs none (--metric mse)")
        if config.mode == "static" and ctx.calib is None:
            raise DataError("static INT8 quantization needs a calibration set",
                            hint="pass --calib-data CALIB.npz (or use mode: dynamic in the recipe)")
        qat_source, qat_skip = source_for_qat(artifact, config, ctx)
        qat_train, bad_train = train_for_qat(qat_source, config, ctx)
        qat_skip = qat_skip or bad_train
        started = time.perf_counter()
        n = config.eval_samples or ctx.eval.n
        stream = getattr(ctx.eval, "stream", None)  # a stream is scored from its start: first-N subsets
        full = Scorer([x[:n] for x in ctx.eval.xs], ctx.eval.y, plan, stream)
        screen = (Scorer([x[:config.screen_samples] for x in ctx.eval.xs], ctx.eval.y, plan, stream)
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
            trials = Trials(src, ctx, tmpdir, user_excluded, config.max_trials)
            trials.full_n = full.n
            search = Ladder(trials, full, screen, base_acc, base_screen, tol, config)
            probe = None
            if config.speed_probe and config.device == "host" and len(encodings) > 1 and config.mode == "static":
                encodings, probe = _speed_probe(trials, encodings, methods[0], src, full.xs, stream)
            try:
                chosen = search.run(encodings, methods, src, candidates, tmpdir)
            except OutOfBudget:
                chosen = None
                search.why = "trial budget (max_trials) spent"
            # 5: quantization-aware fine-tuning when PTQ missed (or needed too many float ops) and train data is here
            qat = QatRunner(config, ctx, qat_source, qat_skip, qat_train, full, screen, base_acc, base_screen, tol,
                           tmpdir)
            won = qat.maybe_run(chosen, search, trials, candidates, encodings, methods, user_excluded)
            if won is not None:
                chosen = won
            if chosen is None:
                best_acc, best_enc, best_nodes = max(trials.best, qat.best, key=lambda b: b[0])
                mname = full.metric.label()
                raise PassError(
                    f"no INT8 configuration met the tolerance of {tol:.4g} ({mname}; {search.why}{qat.note()}): the "
                    f"best found keeps {best_nodes or 'no op'} in float ({best_enc or 'no encoding ran'}) and drops "
                    f"{base_acc - best_acc:.4g} (fp32 {shown(full.value(base_acc))}, full INT8 "
                    f"{shown(search.full_int8.get('accuracy'))}); no model was written",
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
            **({"calibration_stream": stream_note(ctx.calib.stream, ctx.calib.n)}
               if ctx.calib is not None and getattr(ctx.calib, "stream", None) is not None else {}),
            **({"train_data": str(ctx.train.path)} if qat.ran else {}),
        }
        return PassOutput(path=out, precision="mixed" if metrics["float_ops"] else "int8", metrics=metrics)

    @staticmethod
    def _preprocess(artifact, config, tmpdir: Path, full: Scorer, screen: Scorer):
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



def _speed_probe(trials: Trials, encodings: list[OrtQuantizeConfig], method: str, src: Artifact,
                 xs: list[np.ndarray], stream: Any = None) -> tuple[list[OrtQuantizeConfig], dict[str, Any]]:
    """The encodings ordered by the median thread CPU time per inference of their full-INT8 builds on
    this host (``measure/host_speed.py``: onnxruntime, 1 thread, alternating rounds: CPU time does not count
    other jobs holding the core), with fp32 measured beside them."""
    started = time.perf_counter()
    cfgs = [e.model_copy(update={"calibration_method": method}) for e in encodings]
    paths: dict[str, Path] = {"fp32": Path(src.path)}
    for c in cfgs:
        try:
            paths[encoding_label(c)] = trials.build(c, frozenset())
        except PassError:
            continue  # the ladder meets the failure again and records it
    sessions = ort_sessions(paths, xs, stream)
    if "fp32" not in sessions or len(sessions) < 3:
        return encodings, {}
    ms = cpu_ms_per_inference(sessions)
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
