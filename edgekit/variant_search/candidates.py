"""The candidate variants a target can run, as recipe variants (name + passes).

ONNX Runtime INT8 encodings differ a lot in speed by CPU (VNNI or not, QDQ fusion or not), so the
search tries the rungs of the INT8 ladder rather than trusting one default:
  - ort-int8-default  : QDQ, S8S8, per-tensor (what `quantize_static` does with no arguments)
  - ort-int8-qdq-s8s8 : QDQ, S8S8, per-channel weights (onnxruntime's recommended CPU setting)
  - ort-int8-qdq-u8s8 : QDQ, U8 activations, S8 weights, per-tensor (the fast encoding on x86 with VNNI here)
  - ort-int8-mixed    : the accuracy-aware pass (fastest encoding, calibration methods, then the fewest
                        most-sensitive nodes kept in float)
  - ort-int8-dynamic  : weights only, activations quantized at run time
LiteRT candidates come from the `convert` pass when it is installed: fp32, fp16, full-integer INT8
with float I/O, and dynamic-range INT8. Both lists are rows of the format registry
(``formats.FORMATS``: ``search_candidates``); a runtime added there brings its own.
"""

from __future__ import annotations

from ..agent.host import cpu_flags
from ..formats import FORMATS, Candidate, Format, format_spec, spec_for_runtime
from ..inputs.recipe import PassStep, VariantSpec
from ..inputs.targets import TargetSpec
from ..pass_names import known_passes


def _steps(cand: Candidate) -> list[PassStep]:
    return [PassStep(name=name, config=dict(cfg)) for name, cfg in cand.passes]


# (name, passes, needs calibration data): the registry's rows, kept under their old names
ORT_CANDIDATES: list[tuple[str, list[PassStep], bool]] = [
    (c.name, _steps(c), c.needs_calib) for c in format_spec(Format.ONNX).search_candidates]
TFLITE_CANDIDATES: list[tuple[str, dict[str, object], bool]] = [
    (c.name, dict(c.passes[0][1]), c.needs_calib) for c in format_spec(Format.TFLITE).search_candidates]


def quick_here(target: TargetSpec, cand: Candidate) -> bool:
    """Whether ``cand`` joins the short search because the device is this host and its CPU has one of the
    candidate's ``quick_on_cpu`` flags (a remote board names its winners in its target file: short_search)."""
    return bool(cand.quick_on_cpu) and target.transport == "local" and bool(cpu_flags() & set(cand.quick_on_cpu))


def calibrated(name: str) -> bool:
    """Whether the registry's search candidate ``name`` is full INT8: its activations are quantized from the
    calibration set (``needs_calib``). Dynamic-range INT8 (``*-dynamic``: INT8 weights, float activations) is
    not: it keeps the accuracy where full INT8 loses it, and runs at or below fp32's speed on x86 (PP-OCRv4's
    recognizer: tflite-dynamic 44 ms against tflite-fp32's 16 ms)."""
    return any(c.needs_calib for row in FORMATS for c in row.search_candidates if c.name == name)


def candidate_variants(target: TargetSpec, *, has_calib: bool, quick: bool = False,
                       fallback: bool = False) -> tuple[list[VariantSpec], list[tuple[str, str]]]:
    """Candidates for ``target`` (the fp32 ONNX baseline is always measured besides these): the
    ``search_candidates`` of each of its runtimes' registry rows (``quick``: only those marked as the
    likeliest winners, for the default deploy's short search, and those the target's ``short_search``
    adds; ``fallback``: only the short search's float fallbacks), open-ended ones last, and the candidates
    skipped with the reason."""
    out: list[tuple[bool, VariantSpec]] = []
    skipped: list[tuple[str, str]] = []
    known = set(known_passes())
    for runtime in target.runtimes:
        row = spec_for_runtime(runtime)
        if row is None or row.search_skip or not row.search_candidates:
            why = (row.search_skip if row is not None and row.search_skip
                   else "profiling {runtime} needs its own host (e.g. Core ML needs macOS)")
            skipped.append((runtime, why.format(runtime=runtime)))
            continue
        for cand in row.search_candidates:
            if fallback and not cand.fallback:
                continue
            if quick and not (cand.quick or cand.name in target.short_search or quick_here(target, cand)):
                skipped.append((cand.name, "not in the default deploy's short search (--search tries it)"))
                continue
            if any(name not in known for name, _ in cand.passes):
                skipped.append((cand.name, f"the {row.label} converter is not installed in this edgekit"))
                continue
            if cand.needs_calib and not has_calib:
                skipped.append((cand.name, "needs --calib-data"))
                continue
            out.append((cand.open_ended, VariantSpec(name=cand.name, passes=_steps(cand))))
    # built in this order: the open-ended searches (the accuracy-aware ladder) after every single-shot one
    return [v for _, v in sorted(out, key=lambda e: e[0])], skipped

