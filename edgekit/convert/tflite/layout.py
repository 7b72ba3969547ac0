"""Which tensor of a .tflite is which ONNX tensor, and in which layout. onnx2tf makes NHWC graphs from NCHW
models: the permutation of each input and output is found by running the fp32 graph against ONNX Runtime on
a few eval samples (``find_layout``) and recorded in the artifact's io spec (``transpose``), so users keep
feeding NCHW data. A fp16/int8 file's tensors are matched to the fp32 file's by name, signature or shape
(outputs that share a shape: by their values), never by position alone (``_final_io``)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ...artifact import IOSpec, TensorSpec
from ...errors import ConversionError
from ..parity import compare
from .config import HOP
from .host_harness import _first_samples, _tflite_details, run_tflite_all

Details = list[dict[str, Any]]  # the interpreter's tensor details (name, index, shape, dtype, quantization)


def _perm_candidates(user: tuple, runtime: tuple) -> list[tuple[int, ...] | None]:
    """Permutations p with runtime.shape[k] == user.shape[p[k]]: identity, channels-last, channels-first."""
    r = len(user)
    if r != len(runtime):
        return []
    cands: list[tuple[int, ...]] = [tuple(range(r))]
    if r >= 3:
        cands += [(0, *range(2, r), 1), (0, r - 1, *range(1, r - 1))]
    ok = []
    for p in dict.fromkeys(cands):
        if all(user[p[k]] is None or runtime[k] is None or user[p[k]] == runtime[k] for k in range(r)):
            ok.append(None if p == tuple(range(r)) else p)
    return ok


def _details_specs(details: Sequence[dict[str, Any]], onnx_specs: Sequence[TensorSpec],
                   perms: Sequence[Sequence[int] | None]) -> tuple[TensorSpec, ...]:
    out = []
    for det, src, perm in zip(details, onnx_specs, perms):
        dt = np.dtype(det["dtype"]).name
        scale, zp = (det.get("quantization") or (0.0, 0))[:2]
        q = dt in ("int8", "uint8", "int16") and scale
        out.append(TensorSpec(name=det["name"], shape=src.shape, dtype=dt, layout=src.layout,
                              transpose=perm, scale=float(scale) if q else None, zero_point=int(zp) if q else None))
    return tuple(out)

def _norm_name(name: str) -> str:
    """A tensor name as onnx2tf may have rewritten it: without the signature prefix, the ':0' suffix
    and with ':' and '/' made '_'."""
    n = re.sub(r":\d+$", "", name)
    n = n.removeprefix("serving_default_")
    return n.replace(":", "_").replace("/", "_").replace(".", "_")


def _by_name(details: Details, onnx_specs: Sequence[TensorSpec]) -> Details | None:
    """Interpreter tensors in the ONNX model's order when every name can be matched, else None."""
    by_name = {d["name"]: d for d in details}
    if all(s.name in by_name for s in onnx_specs):
        return [by_name[s.name] for s in onnx_specs]
    norm = {_norm_name(d["name"]): d for d in details}
    if len(norm) == len(details) and all(_norm_name(s.name) in norm for s in onnx_specs):
        return [norm[_norm_name(s.name)] for s in onnx_specs]
    return None


def _match(details: Details, onnx_specs: Sequence[TensorSpec], kind: str) -> Details:
    """Interpreter tensors in the ONNX model's order: by name when onnx2tf kept the names, else by
    shape when each ONNX tensor fits exactly one (up to a layout permutation), else in the
    interpreter's order."""
    if len(details) != len(onnx_specs):
        raise ConversionError(f"the TFLite model has {len(details)} {kind}s, the ONNX model {len(onnx_specs)}", hop=HOP)
    named = _by_name(details, onnx_specs)
    if named:
        return named
    fits = [[d for d in details if _perm_candidates(tuple(s.shape), _shape_of(d))] for s in onnx_specs]
    if all(len(f) == 1 for f in fits) and len({int(f[0]["index"]) for f in fits}) == len(fits):
        return [f[0] for f in fits]
    return list(details)


def _restored(y: np.ndarray, perm: Sequence[int] | None) -> np.ndarray:
    if perm is None:
        return y
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return np.transpose(y, inv)


def _err(ref: np.ndarray, got: np.ndarray) -> float:
    if ref.size != got.size:  # same size, other shape (a squeezed axis): compare() reshapes, as parity does
        return float("inf")
    return compare(ref, got, "probe").max_abs_err


def find_layout(fp32_path: Path, onnx_io: IOSpec, onnx_ref: Callable, probe: list[np.ndarray]) -> IOSpec:
    """The io spec of the fp32 .tflite with the permutations that make it agree with ONNX on
    ``probe``, every output in the ONNX model's order. ``onnx_ref`` returns every ONNX output (a
    list) or, from older callers, only the first. When onnx2tf did not keep the output names, each
    ONNX output is matched to the TFLite output (and permutation) that reproduces it."""
    din, dout = _tflite_details(fp32_path)
    din = _match(din, onnx_io.inputs, "input")
    if len(dout) != len(onnx_io.outputs):
        raise ConversionError(f"the TFLite model has {len(dout)} outputs, the ONNX model {len(onnx_io.outputs)}",
                              hop=HOP)
    named = _by_name(dout, onnx_io.outputs)
    in_c = [_perm_candidates(s.shape, tuple(d["shape"])) for s, d in zip(onnx_io.inputs, din)]
    for s, d, c in zip(onnx_io.inputs, din, in_c):
        if not c:
            raise ConversionError(f"TFLite input {d['name']} has shape {tuple(d['shape'])}, which no layout "
                                  f"permutation maps to the ONNX input {s.name} {s.shape}", hop=HOP,
                                  hint="try keep_input_layout: true, or fix the input sizes with --input-shape")
    refs = onnx_ref(probe)
    refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
    raw_specs = tuple(TensorSpec(name=d["name"], shape=tuple(int(v) for v in d["shape"]),
                                 dtype=np.dtype(d["dtype"]).name) for d in dout)
    best = None
    for in_p in itertools.product(*in_c):
        io_in = _details_specs(din, onnx_io.inputs, in_p)
        try:
            raw = run_tflite_all(fp32_path, IOSpec(inputs=io_in, outputs=raw_specs), probe)
        except ConversionError:  # a wrong permutation can make shapes not fit: just not this candidate
            continue
        chosen, errs, used = [], [], set()
        for k, (spec, ref) in enumerate(zip(onnx_io.outputs, refs if len(refs) == len(onnx_io.outputs) else
                                             [*refs, *[None] * (len(onnx_io.outputs) - len(refs))])):
            cands = [dout.index(named[k])] if named else [j for j in range(len(dout)) if j not in used]
            pick = None
            for j in cands:
                for perm in _perm_candidates(spec.shape, tuple(dout[j]["shape"])) or [None]:
                    e = 0.0 if ref is None else _err(np.asarray(ref), _restored(raw[j], perm))
                    if pick is None or e < pick[0]:
                        pick = (e, j, perm)
            if pick is None:
                break
            used.add(pick[1])
            chosen.append(pick)
            errs.append(pick[0])
        if len(chosen) != len(onnx_io.outputs):
            continue
        total = max(errs) if errs else 0.0
        if best is None or total < best[0]:
            outs = _details_specs([dout[j] for _, j, _ in chosen], onnx_io.outputs, [p for _, _, p in chosen])
            best = (total, IOSpec(inputs=io_in, outputs=outs))
    if best is None or not np.isfinite(best[0]):
        raise ConversionError("no input/output layout of the TFLite model reproduces the ONNX outputs' shapes",
                              hop=HOP, hint="try keep_input_layout: true")
    return best[1]


def _signature_indices(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The .tflite's first signature as ({input key: tensor index}, {output key: tensor index}); empty
    without one (onnx2tf's own files have none; TFLiteConverter's from a SavedModel have one, keyed
    by the SavedModel's names: the ONNX input names, and output_0, output_1... in the ONNX output order)."""
    try:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            from tensorflow.lite import Interpreter  # type: ignore[no-redef]
        it = Interpreter(model_path=str(path))
        sigs = it.get_signature_list()
        if not sigs:
            return {}, {}
        runner = it.get_signature_runner(next(iter(sigs)))
        return ({k: int(v["index"]) for k, v in runner.get_input_details().items()},
                {k: int(v["index"]) for k, v in runner.get_output_details().items()})
    except Exception:  # no signature API in this runtime: match by the other means
        return {}, {}


def _shape_of(d: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in d["shape"])


def _align(dets: Details, f32: Details, specs32: Sequence[TensorSpec], onnx_specs: Sequence[TensorSpec],
           sig: dict[str, int], kind: str) -> list[dict[str, Any] | None]:
    """``dets`` (the interpreter tensors of a file made from the same graph as the fp32 one) in the
    order of ``specs32`` (the fp32 file's tensors, in the ONNX model's order), each matched by its
    tensor name, else by the file's signature key (the ONNX name, or ``output_K``: the K-th ONNX
    output), else by its normalized name, else by its shape when only one tensor has it; never by
    position alone. None stands for a tensor none of these tell apart (shared shapes, no names)."""
    by_name = {d["name"]: d for d in dets}
    by_index = {int(d["index"]): d for d in dets}
    norm = {}
    for d in dets:
        norm.setdefault(_norm_name(d["name"]), []).append(d)
    f32_shape = {d["name"]: _shape_of(d) for d in f32}
    keys = {}
    for key, idx in sig.items():
        keys.setdefault(_norm_name(key), []).append(idx)
    picked: list = [None] * len(specs32)
    used: set[int] = set()

    def take(k: int, d: dict[str, Any] | None) -> bool:
        if d is None or int(d["index"]) in used:
            return False
        want = f32_shape.get(specs32[k].name)
        if want is not None and _shape_of(d) != want:  # same graph, same shapes: a mismatch is a wrong match
            return False
        picked[k] = d
        used.add(int(d["index"]))
        return True

    steps = [
        lambda k: by_name.get(specs32[k].name),
        lambda k: (by_index.get(keys[_norm_name(onnx_specs[k].name)][0])
                   if len(keys.get(_norm_name(onnx_specs[k].name), [])) == 1 else None),
        lambda k: (by_index.get(sig[f"output_{k}"]) if kind == "output" and f"output_{k}" in sig
                   and not any(_norm_name(s.name) in keys for s in onnx_specs) else None),
        lambda k: (norm[_norm_name(onnx_specs[k].name)][0] if len(norm.get(_norm_name(onnx_specs[k].name), [])) == 1
                   else None),
    ]
    for step in steps:
        for k in range(len(specs32)):
            if picked[k] is None:
                try:
                    take(k, step(k))
                except (KeyError, IndexError):
                    pass
    for k in range(len(specs32)):  # by shape: the one remaining tensor with the fp32 tensor's shape
        if picked[k] is None:
            want = f32_shape.get(specs32[k].name)
            same = [d for d in dets if int(d["index"]) not in used and _shape_of(d) == want]
            if len(same) == 1:
                take(k, same[0])
    return picked


def _final_io(final: Path, fp32: Path, io32: IOSpec, onnx_io: IOSpec,
              probe: list[np.ndarray] | None = None) -> IOSpec:
    """The io spec of the fp16/int8 file made from the same graph as the fp32 one, every tensor
    matched to the fp32 file's (see _align) and given its permutation. Outputs that share a shape and
    no name are told apart by their values on ``probe`` (the fp32 file's outputs); inputs by their
    order only when nothing else can tell them apart (the SavedModel keeps the ONNX input order)."""
    din, dout = _tflite_details(final)
    fin, fout = _tflite_details(fp32)
    if len(din) != len(fin) or len(dout) != len(fout):
        raise ConversionError(f"the {final.name} graph has other inputs/outputs than the fp32 graph", hop=HOP)
    sig_in, sig_out = _signature_indices(final)
    ins = _align(din, fin, io32.inputs, onnx_io.inputs, sig_in, "input")
    if any(d is None for d in ins):
        left = [d for d in din if all(d is not p for p in ins)]
        ins = [d if d is not None else left.pop(0) for d in ins]
    outs = _align(dout, fout, io32.outputs, onnx_io.outputs, sig_out, "output")
    if any(d is None for d in outs):
        outs = _by_values(final, fp32, io32, ins, outs, dout, probe)
    return IOSpec(inputs=_details_specs(ins, onnx_io.inputs, [s.transpose for s in io32.inputs]),
                  outputs=_details_specs(outs, onnx_io.outputs, [s.transpose for s in io32.outputs]))


def _raw_spec(d: dict[str, Any]) -> TensorSpec:
    dt = np.dtype(d["dtype"]).name
    scale, zp = (d.get("quantization") or (0.0, 0))[:2]
    q = dt in ("int8", "uint8", "int16") and scale
    return TensorSpec(name=d["name"], shape=_shape_of(d), dtype=dt, scale=float(scale) if q else None,
                      zero_point=int(zp) if q else None)


def _by_values(final: Path, fp32: Path, io32: IOSpec, ins: Details, outs: list[dict[str, Any] | None], dout: Details,
               probe: list[np.ndarray] | None) -> Details:
    """The unmatched outputs of ``final`` matched to the fp32 file's by their values on ``probe``:
    each to the remaining same-shape tensor closest to the fp32 output."""
    missing = [s.name for s, d in zip(io32.outputs, outs) if d is None]
    if not probe:
        raise ConversionError(f"cannot tell which output of {final.name} is {', '.join(missing)}: they share a "
                              "shape and the file names none of them", hop=HOP)
    x = _first_samples(probe, 2)
    # the fp32 outputs in the TFLite layout (no permutation undone), in the ONNX order
    ref = run_tflite_all(fp32, IOSpec(inputs=io32.inputs, outputs=tuple(
        TensorSpec(name=s.name, shape=s.shape, dtype=s.dtype) for s in io32.outputs)), x)
    in_specs = _details_specs(ins, io32.inputs, [s.transpose for s in io32.inputs])
    cand = [d for d in dout if all(d is not p for p in outs)]
    got = run_tflite_all(final, IOSpec(inputs=in_specs, outputs=tuple(_raw_spec(d) for d in cand)), x)
    outs = list(outs)
    for k, d in enumerate(outs):
        if d is not None:
            continue
        best = None
        for j, c in enumerate(cand):
            if c is None or got[j].shape != ref[k].shape:
                continue
            e = _err(np.asarray(ref[k]), got[j])
            if best is None or e < best[0]:
                best = (e, j)
        if best is None:
            raise ConversionError(f"no output of {final.name} has the shape of {io32.outputs[k].name}", hop=HOP)
        outs[k] = cand[best[1]]
        cand[best[1]] = None
    return outs

