"""The accuracy-aware pass's QAT rung (rung 5 in ``quantize.py``): quantization-aware fine-tuning
(``passes/quantize_qat.py``), then the PTQ ladder (``ladder.py``) again on the fine-tuned weights, scored
against the original fp32 model. ``QatRung`` (``config.py``) is its part of the pass config;
``source_for_qat``/``train_for_qat`` check, before any quantization time, whether it can run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...artifact import Artifact
from ...errors import DataError
from ...formats import Format
from ...inputs.data import Dataset, check_fits
from ...inputs.source import load_onnx
from ...logs import quiet
from ...timeline import BudgetExceeded
from ..base import PassContext
from ..quantize_ort import OrtQuantizeConfig, encoding_label
from ..quantize_qat import finetune, finetuned_onnx, task_of
from .ladder import Ladder, OutOfBudget, Result, Scorer, Trials, quantizable_ops, rounded, shown

if TYPE_CHECKING:
    from .config import AccuracyAwareConfig


def source_for_qat(artifact: Artifact, config: AccuracyAwareConfig, ctx: PassContext) -> tuple[Any, str | None]:
    """(the PyTorch source the input ONNX was exported from, None) or (None, why QAT cannot run)."""
    if not config.qat.enabled:
        return None, "qat.enabled is false"
    if config.mode != "static":
        return None, "QAT simulates static INT8 (give --calib-data)"
    src = ctx.source
    if getattr(src, "program", None) is None:
        return None, "QAT fine-tunes the PyTorch model and the source is not one (give the .pt2)"
    k = len(src.artifact.lineage)
    if tuple(artifact.lineage[:k]) != tuple(src.artifact.lineage) or any(
            st.kind == "pass" for st in artifact.lineage[k:]):
        return None, "the input is not the source model's own export (QAT fine-tunes the source program)"
    return src, None


def train_for_qat(source: Any, config: AccuracyAwareConfig, ctx: PassContext) -> tuple[Dataset | None, str | None]:
    """(the train data aligned to the source's inputs, None) or (None, why the rung cannot use it).
    Checked before any quantization time; not an error here: a deploy's train data may be meant for
    another pass (`edgekit quantize --train-data` refuses it itself)."""
    if source is None or ctx.train is None:
        return None, None
    try:
        train = check_fits(ctx.train, source.artifact.io, "train")
        task_of(train, tuple(source.artifact.io.outputs[0].shape), config.qat.alpha)
    except DataError as exc:
        return None, f"the train data does not fit it ({exc.message})"
    return train, None


class QatRunner:
    """Quantization-aware fine-tuning (``quantize_qat``), then the PTQ rungs again on the fine-tuned
    weights, scored against the original fp32 model. Runs when no PTQ configuration met the tolerance,
    or when mixed precision met it only with more than ``qat.above_float_fraction`` of the ops in float
    (then the QAT model must keep fewer ops in float to win)."""

    def __init__(self, config: AccuracyAwareConfig, ctx: PassContext, source: Any, skip: str | None,
                 train: Dataset | None,
                 full: Scorer, screen: Scorer, base: float, base_screen: float, tol: float, tmpdir: Path):
        self.config, self.ctx, self.source, self.skip, self.train = config, ctx, source, skip, train
        self.full, self.screen, self.tmpdir = full, screen, tmpdir
        self.base, self.base_screen, self.tol = base, base_screen, tol
        self.doc: dict = {}
        self.rungs: list[dict] = []
        self.ran = False
        self.wants_train_data = False
        self.ladder: Ladder | None = None
        self.trials: Trials | None = None
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

    def maybe_run(self, chosen: Result | None, search: Ladder, trials: Trials, candidates: set[str],
                  encodings: list[OrtQuantizeConfig], methods: list[str], user_excluded: set[str]) -> Result | None:
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
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            result, doc = None, {"error": f"{type(exc).__name__}: {first}"}
        within = result is not None
        outcome = (f"within tolerance ({self.ladder.rung}: {encoding_label(result[0])}, {len(result[1])} ops in float)"
                   if within else (f"failed ({doc['error']})" if "error" in doc else
                                   f"outside tolerance ({self.ladder.why}; best drop "
                                   f"{shown(self.base - self.best[0] if np.isfinite(self.best[0]) else None)})"))
        self.rungs.append({"rung": "qat", "trials": self.trial_count,
                           "seconds": round(time.perf_counter() - started, 3),
                           "result": outcome, **{k: doc[k] for k in ("finetune_seconds", "export_seconds") if k in doc},
                           **({"ladder": self.ladder.rungs} if self.ladder is not None else {})})
        self.doc = {"why": why, "ran": True, "won": within, **doc}
        return result

    def _run(self, chosen: Result | None, trials: Trials, encodings: list[OrtQuantizeConfig], methods: list[str],
             user_excluded: set[str]) -> tuple[Result | None, dict[str, Any]]:
        import onnx  # heavy: onnx

        from .._torch import torch_threads  # heavy: torch

        q, src = self.config.qat, self.source
        qdir = self.tmpdir / "qat"
        qdir.mkdir()
        t0 = time.perf_counter()
        # simulate the encoding whose full INT8 came closest (fine-tuning from a collapsed model, e.g. per-tensor
        # weights with outlier channels, does not recover in a few epochs); its ladder tries that one first
        enc = _closest_full_int8(trials, encodings, methods, self.full.n)
        minmax = {"calibration_method": "minmax"}
        encodings = [enc, *[e for e in encodings if encoding_label(e.model_copy(update=minmax))
                            != encoding_label(enc.model_copy(update=minmax))]]
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
        doc["finetuned_fp32_accuracy"] = rounded(self.full.value(ft_acc))
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
        self.trials = Trials(qsrc, self.ctx, qdir, self.user_excluded,
                              max(3, self.config.max_trials - trials.count))
        self.trials.full_n = self.full.n
        self.ladder = Ladder(self.trials, self.full, self.screen, self.base, self.base_screen, self.tol, cfg)
        try:
            result = self.ladder.run(encodings, methods, qsrc, self.candidates, qdir)
        except OutOfBudget:
            result = None
            self.ladder.why = "trial budget (max_trials) spent"
        if self.ladder.sensitivity_doc:
            doc["sensitivity"] = self.ladder.sensitivity_doc
        return result, doc


def _closest_full_int8(trials: Trials, encodings: list[OrtQuantizeConfig], methods: list[str],
                       n: int) -> OrtQuantizeConfig:
    """The encoding (with its calibration method) of the best full-INT8 trial on the whole eval set,
    else the fastest encoding."""
    by_label = {encoding_label(c): c for c in (e.model_copy(update={"calibration_method": m})
                                               for e in encodings for m in methods)}
    scored = [(acc, label) for (label, nodes, samples), (acc, _, _) in trials.memo.items()
              if not nodes and samples == n and label in by_label and np.isfinite(acc)]
    return by_label[max(scored)[1]] if scored else encodings[0]

