"""A microcontroller target's run (``deploy`` with a target whose transport is ``host-interpreter``): there is no
board, so no device session. The same preparation as every run (``prepare.prepare_run``: data, model, metric
plan, fp32 ONNX), then: every op checked against TFLite Micro's kernels (refused before conversion, naming the
layer), full-integer INT8 TFLite with int8 inputs and outputs through the converter chain, climbing the INT8 ladder
judged by TFLM's accuracy (``micro_ladder.py``; a full-integer ``.tflite`` given as it is skips both), the workload
(``micro/workload.py``: the smallest arena, the eval set through TFLM and LiteRT), with training data a file that
does not fit pruned until it does (``micro_prune.py``), the one report (``assemble.new_report``: the gate judges the
TFLM outputs, the fit and TFLM-vs-LiteRT parity) and the one ship writer, with the firmware's files beside."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..artifact import Artifact
from ..convert.chain import convert_to_tflite
from ..convert.tflite.config import TfliteConfig
from ..errors import BadInputError
from ..formats import Format
from ..fsutil import atomic_write_text
from ..inputs.data import Dataset
from ..inputs.recipe import Recipe
from ..inputs.targets import Microcontroller, TargetSpec
from ..metrics.evaluate import EvalPlan, score_drops
from ..micro.c_array import c_name, to_c_array
from ..micro.fit import Fit, fit_checks, judge_fit
from ..micro.interpreter import Arena
from ..micro.kernels import SOURCE, tflm_version
from ..micro.onnx_ops import refuse_unsupported
from ..micro.tflite_graph import full_integer_problems
from ..micro.workload import LATENCY_REASON, PARITY_STEPS, MicroMeasurement, measure_micro
from ..report.gate import evaluate_gate
from ..report.model import Accuracy, Check, DeviceInfo, Report, RuntimeInfo, VariantResult
from ..report.write import write_report
from .assemble import metric_settings, new_report, tolerance
from .micro_ladder import Climb, Rung, climb, rungs
from .micro_prune import Pruning, prune_to_fit, pruning_refusal
from .options import DeployOptions
from .prepare import PreparedRun, prepare_run
from .ship import interface, write_file_set, write_nothing_shipped

Progress = Callable[[str], None]
BASELINE, JUDGED = "fp32", "tflm-int8"
GIVEN = "given-int8"  # the reference row when the model is a full-integer INT8 .tflite (its LiteRT outputs)
PRUNED = "tflm-int8-pruned"  # the judged file when the unpruned one did not fit and pruning made it fit
_SECTION = "micro"  # the variant's microcontroller section (arena, fit, ops, LiteRT beside)
MICRO_CONFIG = TfliteConfig(precision="int8", quantization="full", io="int8", parity_bar="breakage")


def deploy_micro(model: Any, *, eval_data: str | Path, target: TargetSpec, calib_data: str | Path | None,
                 out: str | Path, example_inputs: tuple[Any, ...] | None, arch: str | None,
                 x_key: str | tuple[str, ...], y_key: str, opts: DeployOptions, progress: Progress) -> Report:
    """The INT8 file TFLM runs, measured for ``target``'s part; the report written, ship/ when the gate passes."""
    part = target.microcontroller
    if part is None:
        raise BadInputError(f"target {target.name} is not a microcontroller",
                            hint="name a target with a microcontroller: section")
    run = prepare_run(model, eval_data=eval_data, target=target, recipe=Recipe(baseline=BASELINE, variants=[]),
                      opts=opts, calib_data=calib_data, out=out, example_inputs=example_inputs, arch=arch,
                      x_key=x_key, y_key=y_key, progress=progress)
    warnings = list(opts.extra_warnings)
    calib = run.calib_ds or run.eval_ds
    f = _int8_file(run, part, calib, warnings, progress)
    base_name, base, tflm, m = f.base.name, f.base, _row_tflm(f.art, f.m, run.plan), f.m
    getattr(tflm, _SECTION)["int8_ladder"] = f.ladder
    rows, outputs = [base, tflm], {base_name: run.plan.reference, JUDGED: m.tflm}
    judged, judged_art, judged_m = JUDGED, f.art, m
    refusal = pruning_refusal(run) if not m.fit.fits else None
    if not m.fit.fits and refusal is None:  # memory is the budget: prune until TFLM's arena fits (micro_prune.py)
        progress(f"{JUDGED} does not fit {target.name}: pruning channels until TFLite Micro's arena fits")
        pruning = _prune(run, part, m, calib, f.cfg, progress)
        getattr(tflm, _SECTION)["pruning"] = pruning.record
        if pruning.art is not None:
            pm = measure_micro(pruning.art.path, pruning.art.io, part, list(run.eval_ds.xs))
            rows.append(_row_tflm(pruning.art, pm, run.plan, PRUNED))
            outputs[PRUNED] = pm.tflm
            judged, judged_art, judged_m = PRUNED, pruning.art, pm
        else:
            warnings.append(f"{JUDGED} does not fit {target.name} and pruning did not make it fit: "
                            f"{pruning.record.get('stopped')}")
    if judged != PRUNED:
        warnings += [f"{JUDGED} does not fit {target.name}: {what}" for what in m.fit.what_must_shrink()]
    if refusal:
        warnings.append(f"{JUDGED}: {refusal}")
    warnings += _disagreement_warnings(judged_m, judged)
    score_drops(rows, outputs, run.plan, base_name, tolerance(run.gate, base))
    if judged == PRUNED:
        rec = getattr(tflm, _SECTION)["pruning"]
        _pruning_summary(rec, tflm, rows[-1])
        getattr(rows[-1], _SECTION)["pruning"] = rec
        warnings.append(f"{JUDGED} did not fit {target.name}; shipped {PRUNED}: {rec['summary']}")
    gate = evaluate_gate(rows, base_name, run.gate, judged=[judged])
    gate.checks += [Check(**c) for c in fit_checks(judged_m.fit, judged)]
    if refusal:
        for c in gate.checks:
            if c.name in ("micro_sram_fit", "micro_flash_fit") and not c.passed:
                c.message += f"; {refusal}"
    gate.passed = all(c.passed for c in gate.checks)
    report = new_report(target=target.name, session=None, first_doc=None, results=rows, model=run.model_facts(),
                        started=run.started, baseline=base_name, gate=gate,
                        warnings=warnings + [f"{JUDGED}: latency not measured: {LATENCY_REASON}"],
                        settings={"metric": metric_settings(run.plan), "gate": run.gate.model_dump(mode="json"),
                                  "microcontroller": part.model_dump(mode="json")},
                        device=DeviceInfo(name=f"{target.name} (no board: TFLite Micro on this host)",
                                          arch=target.arch, target_arch=target.arch))
    if gate.passed:
        shipped = rows[-1] if judged == PRUNED else tflm
        shipped.selected = True
        ship_micro(run.out_dir, shipped, judged_art, run.source.artifact.io, judged_m)
    else:
        failed = "; ".join(f"{c.name}: {c.message}" for c in gate.failed_checks)
        write_nothing_shipped(run.out_dir, "microcontroller", f"the gate failed: {failed}")
    write_report(report, run.out_dir)
    return report


@dataclass
class _Int8File:
    base: VariantResult  # the reference row: the float model, or a given INT8 file through LiteRT
    art: Artifact  # the full-integer INT8 file TFLM runs
    m: MicroMeasurement
    ladder: dict[str, Any]  # the report's micro.int8_ladder
    cfg: TfliteConfig  # the shipped rung's settings (pruning converts with them)


def _int8_file(run: PreparedRun, part: Microcontroller, calib: Dataset, warnings: list[str],
               progress: Progress) -> _Int8File:
    """The full-integer INT8 file: a given one as it is, or the source checked op by op against TFLM's kernels and
    converted through the INT8 ladder; measured through TFLM."""
    if _given_int8(run.fp32):  # no conversion, no float model
        warnings.append(f"the model was given as a full-integer INT8 .tflite: there is no float model, so "
                        f"{JUDGED}'s accuracy drop is TFLite Micro's against LiteRT's on the same file, and the file "
                        "ships as given")
        progress("TFLite Micro: the smallest arena, the eval set (LiteRT beside it)")
        m = measure_micro(run.fp32.path, run.fp32.io, part, list(run.eval_ds.xs))
        return _Int8File(_row_fp32(run.fp32, run.plan, GIVEN), run.fp32, m,
                         {"skipped": "the model was given as a full-integer INT8 .tflite"}, MICRO_CONFIG)
    progress("checking every op against TFLite Micro's kernels")
    refuse_unsupported(run.fp32.path)
    if run.calib_ds is None:
        warnings.append("no --calib-data: the INT8 activation ranges were calibrated on the eval set")
    base = _row_fp32(run.fp32, run.plan)
    progress("converting to full-integer INT8 TFLite (int8 inputs and outputs), judged by TFLite Micro's accuracy")
    ladder = _climb(run, part, calib, tolerance(run.gate, base), progress)
    return _Int8File(base, ladder.art, ladder.m, ladder.record, ladder.rung.cfg)


def _climb(run: PreparedRun, part: Microcontroller, calib: Dataset, tol: float | None, progress: Progress) -> Climb:
    """The INT8 ladder (micro_ladder.py): each rung converted and measured through TFLM until one is inside the
    gate's accuracy tolerance."""
    base_value = _accuracy(run.plan, run.plan.reference)

    def build(i: int, rung: Rung) -> tuple[Artifact, MicroMeasurement]:
        name = JUDGED if i == 0 else f"{JUDGED}-rung{i + 1}"
        art = convert_to_tflite(run.fp32, run.art_dir / f"{name}.tflite", rung.cfg, source=run.source, calib=calib,
                                parity_inputs=list(run.eval_ds.xs))
        progress("TFLite Micro: the smallest arena, the eval set (LiteRT beside it)")
        return art, measure_micro(art.path, art.io, part, list(run.eval_ds.xs))

    def drop(m: MicroMeasurement) -> float | None:
        got = _accuracy(run.plan, m.tflm)
        d = base_value.value - got.value
        return d if got.direction == "higher" else -d

    return climb(rungs(MICRO_CONFIG, calib.n), build, drop, tol, progress)


def _prune(run: PreparedRun, part: Microcontroller, m: MicroMeasurement, calib: Dataset, cfg: TfliteConfig,
           progress: Progress) -> Pruning:
    def convert(onnx: Artifact, stem: str, data: Dataset) -> Artifact:
        return convert_to_tflite(onnx, run.art_dir / f"{stem}.tflite", cfg, calib=data, parity_inputs=list(data.xs))

    def judge(arena: Arena, model_bytes: int) -> Fit:
        return judge_fit(part, arena, model_bytes, None)

    return prune_to_fit(run, m.fit, convert, progress, judge)


def _pruning_summary(rec: dict[str, Any], before: VariantResult, after: VariantResult) -> None:
    """The widths, the arena before and after and the accuracy cost, in the record and in words."""
    a0 = before.accuracy.value if before.accuracy else None
    a1 = after.accuracy.value if after.accuracy else None
    rec["tflm_accuracy_before"], rec["tflm_accuracy_after"] = a0, a1
    rec["accuracy_cost"] = None if a0 is None or a1 is None else round(a0 - a1, 6)
    metric = before.accuracy.metric if before.accuracy else "accuracy"
    widths = ", ".join(f"{g} {rec['groups'][g]}->{w}" for g, w in rec["widths"].items())
    cost = "" if rec["accuracy_cost"] is None else f", TFLM {metric} {a0:.4g} -> {a1:.4g} (cost {a0 - a1:.4g})"  # type: ignore[operator]
    rec["summary"] = (f"pruned {widths}; arena {rec['arena_before_bytes']} -> {rec['arena_after_bytes']} B "
                      f"(SRAM budget {rec['sram_budget_bytes']} B){cost}")


def _accuracy(plan: EvalPlan, outputs: list[Any]) -> Accuracy:
    return Accuracy.model_validate(plan.accuracy_dict(plan.score(outputs)))


def _given_int8(src: Artifact) -> bool:
    """True for a full-integer INT8 .tflite (deployed as given); False for PyTorch or ONNX (converted here); a float
    or partly-integer .tflite, or another format, is refused (exit 2) naming the fix."""
    if src.format == Format.ONNX:
        return False
    if src.format != Format.TFLITE:
        raise BadInputError(f"a microcontroller target converts from PyTorch or ONNX, not {src.format.value}",
                            hint="pass the .pt2 or .onnx model, or a full-integer INT8 .tflite")
    problems = full_integer_problems(Path(src.path).read_bytes())
    if problems:
        raise BadInputError(f"{src.path} is not a full-integer INT8 TFLite file, which a microcontroller target "
                            f"runs: {'; '.join(problems)}",
                            hint="pass the .pt2 or .onnx model (edgekit converts it to full-integer INT8 with int8 "
                            "inputs and outputs, judged by TFLite Micro), or convert it yourself with TFLiteConverter: "
                            "optimizations=[tf.lite.Optimize.DEFAULT], a representative_dataset, supported_ops="
                            "[tf.lite.OpsSet.TFLITE_BUILTINS_INT8], inference_input_type=inference_output_type=tf.int8")
    return True


def _row_fp32(fp32: Artifact, plan: EvalPlan, name: str = BASELINE) -> VariantResult:
    """The reference outputs on this host: the float model's, or a given INT8 file's through LiteRT; what the TFLM
    file's accuracy is compared with."""
    ref = ("the source model on this host (the float reference)" if name == BASELINE else
           "the given INT8 file through LiteRT on this host (the reference: there is no float model)")
    return VariantResult(name=name, format=fp32.format.value, precision=fp32.precision, size_bytes=fp32.size_bytes,
                         runtime=RuntimeInfo(name=ref),
                         sha256=fp32.sha256, artifact_path=str(fp32.path), lineage=fp32.lineage_dicts(),
                         accuracy=_accuracy(plan, plan.reference))


def _row_tflm(art: Artifact, m: MicroMeasurement, plan: EvalPlan, name: str = JUDGED) -> VariantResult:
    v = VariantResult(name=name, format=art.format.value, precision=art.precision, size_bytes=art.size_bytes,
                      runtime=RuntimeInfo(name="tflite-micro", version=tflm_version(), threads=1),
                      sha256=art.sha256, artifact_path=str(art.path), lineage=art.lineage_dicts(),
                      accuracy=_accuracy(plan, m.tflm), peak_memory_mb=round(m.arena.bytes / 1e6, 6),
                      memory={"source": "tflm_arena", "arena_bytes": m.arena.bytes},
                      parity_outputs=plan.parity(m.tflm))
    v.parity = next(iter(v.parity_outputs.values()), None) if v.parity_outputs else None
    setattr(v, _SECTION, _micro_section(art, m, plan))  # an extra section: the report schema keeps extras
    return v


def _micro_section(art: Artifact, m: MicroMeasurement, plan: EvalPlan) -> dict[str, Any]:
    return {"runtime": "TFLite Micro's reference kernels, the tflite-micro wheel's host build "
                       f"({tflm_version()}): the kernels and allocator are the part's, the timing is not",
            "arena": m.arena.as_dict(), "fit": m.fit.as_dict(), "ops": m.graph.op_set, "op_source": SOURCE,
            "weights_bytes": m.graph.weights_bytes, "macs": m.graph.macs, "macs_by_op": m.graph.macs_by_op,
            "io": _io_quantization(art),
            "litert": {"accuracy": _accuracy(plan, m.litert).model_dump(mode="json"),
                       "disagreement_with_tflm": m.disagreement, "limit_steps": PARITY_STEPS},
            "latency_ms": None, "latency_reason": LATENCY_REASON}


def _io_quantization(art: Artifact) -> dict[str, list[dict[str, Any]]]:
    """What the firmware needs to feed and read the int8 tensors: real = (q - zero_point) * scale."""
    def row(s: Any) -> dict[str, Any]:
        return {"name": s.name, "shape": list(s.shape), "dtype": s.dtype, "scale": s.scale,
                "zero_point": s.zero_point, "layout_transpose": list(s.transpose) if s.transpose else None}
    return {"inputs": [row(s) for s in art.io.inputs], "outputs": [row(s) for s in art.io.outputs]}


def _disagreement_warnings(m: MicroMeasurement, name: str = JUDGED) -> list[str]:
    """TFLM's and LiteRT's outputs further apart than the stated tolerance: reported, not gated (the gate judges
    TFLM's own outputs: they are what the part computes)."""
    return [f"{name}: output {name}: TFLM and LiteRT differ by up to {r['max_steps']:.1f} quantization steps (more "
            f"than {PARITY_STEPS}; {r['exact_share']:.1%} of values equal"
            + (f", top-1 agreement {r['top1_agreement']:.1%}" if "top1_agreement" in r else "")
            + "): their kernels round differently, and the difference grows with depth; the gate judged TFLM's"
            for name, r in m.disagreement.items() if not r["passed"]]


def ship_micro(out_dir: Path, v: VariantResult, art: Artifact, source_io: Any, m: MicroMeasurement) -> None:
    """The one ship writer's folder, plus what a firmware engineer pastes: the aligned C array of the file, the
    arena size and the op list for a ``MicroMutableOpResolver``."""
    micro = {"arena_bytes": m.arena.bytes, "ops": m.graph.op_set, "io": _io_quantization(art)}
    measured = {"accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop,
                "arena_bytes": m.arena.bytes, "p50_ms": None, "latency_reason": LATENCY_REASON}
    write_file_set(out_dir, v, art, {"interface": interface(art, source_io), "measured": measured, "micro": micro})
    ship = out_dir / "ship"
    name = c_name(f"{v.name}_model")
    src, header = to_c_array(Path(art.path).read_bytes(), name)
    atomic_write_text(ship / f"{name}.cc", src)
    atomic_write_text(ship / f"{name}.h", header)
    atomic_write_text(ship / "micro_ops.h", _resolver(m.graph.op_set, m.arena.bytes))
    atomic_write_text(ship / "micro.json", json.dumps(micro, indent=2))


def _method(op: str) -> str:
    """TFLM's ``MicroMutableOpResolver`` method for a builtin: CONV_2D -> Conv2D, BATCH_TO_SPACE_ND -> BatchToSpaceNd,
    UNIDIRECTIONAL_SEQUENCE_LSTM -> UnidirectionalSequenceLSTM."""
    special = {"lstm": "LSTM", "svdf": "Svdf", "padv2": "PadV2"}
    return "".join(special.get(p, p.upper() if p[:1].isdigit() else p.capitalize()) for p in op.lower().split("_"))


def _resolver(ops: list[str], arena: int) -> str:
    adds = "\n".join(f"  resolver.Add{_method(op)}();  // {op}" for op in ops)
    return (f"// generated by edgekit: the ops the model uses and the arena TFLite Micro measured for it\n"
            f"#pragma once\n#include \"tensorflow/lite/micro/micro_mutable_op_resolver.h\"\n\n"
            f"constexpr int kTensorArenaSize = {arena};  // bytes; declare it alignas(16)\n"
            f"using EdgekitOpResolver = tflite::MicroMutableOpResolver<{len(ops)}>;\n\n"
            "inline TfLiteStatus EdgekitRegisterOps(EdgekitOpResolver& resolver) {\n"
            f"{adds}\n  return kTfLiteOk;\n}}\n")
