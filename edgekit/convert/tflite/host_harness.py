"""Running a .tflite on this host exactly as the device does: the agent's own ``LiteRTRunner`` and
``tensors.prepare``/``restore_output`` (``agent/inprocess.py``), fed in chunks of the graph's static batch,
after a child-process probe (``litert_probe.py``) so a LiteRT kernel that aborts becomes a ConversionError,
not a dead edgekit; and the check that the graph needs no TensorFlow Flex op."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ...agent.inprocess import load_agent
from ...artifact import IOSpec
from ...errors import ConversionError
from ...inputs.source import model_batch, run_batched, shares_samples
from ..onnx2tf_errors import log_tail
from .config import HOP

# the probe's source, run with ``python -c`` as one string: the child imports no edgekit (no package on its path
# needed) and starts as it always did
PROBE_SCRIPT = Path(__file__).with_name("litert_probe.py")
_PROBE = PROBE_SCRIPT.read_text(encoding="utf-8")
_probed: dict[tuple[str, int], str | None] = {}


def _agent() -> ModuleType:
    """The device agent module, loaded once in this process (``agent/inprocess.py``): parity on the
    host runs the very code the device runs (LiteRTRunner, tensors.prepare, tensors.restore_output)."""
    return load_agent()


def probe_litert(path: Path) -> None:
    """Load and run the .tflite once in a child process first: a LiteRT kernel that aborts (seen:
    "free(): double free" loading a full-integer detector) would otherwise kill edgekit itself, and
    it would crash the device's interpreter just the same. Raises ConversionError naming the crash."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_mtime_ns)
    if key not in _probed:
        try:
            res = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True,
                                 timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            ok = res.returncode == 0 and res.stdout.strip().endswith("ok")
            signal = f" (signal {-res.returncode})" if res.returncode < 0 else ""
            why = None if ok else (f"exit {res.returncode}" + signal
                                   + ": " + log_tail("\n".join(ln for ln in res.stderr.splitlines()
                                                            if not ln.startswith("INFO:")), 3)[-300:])
        except subprocess.TimeoutExpired:
            why = "no answer within 300 s"
        _probed[key] = why
    why = _probed[key]
    if why is not None:
        raise ConversionError(f"the LiteRT interpreter crashes loading or running the converted model ({why})",
                              hop=HOP, hint="a LiteRT kernel bug for this graph at this precision: the device's "
                              "interpreter would crash the same way; try precision: fp16 or quantization: dynamic")


def _litert_runner(path: Path, threads: int = 1, input_specs: list[dict[str, Any]] | None = None) -> Any:
    agent = _agent()
    probe_litert(path)
    try:
        return agent.runners.LiteRTRunner(str(path), threads, input_specs=input_specs)
    except agent.AgentFailure as exc:
        raise ConversionError(exc.message, hop=HOP,
                              hint="a model that needs TensorFlow Flex ops cannot run on a device's LiteRT "
                              "interpreter; see the ops named above") from exc


def run_tflite_all(path: Path, io: IOSpec, xs: list[np.ndarray], threads: int = 1) -> list[np.ndarray]:
    """Every output of a .tflite model on ``xs`` (user layout and dtype), in ``io.outputs`` order
    (matched to the interpreter's outputs by tensor name), fed with the agent's own code in chunks of
    the graph's static batch size (usually 1)."""
    agent = _agent()
    ins = [s.model_dump(mode="json") for s in io.inputs]
    outs = [s.model_dump(mode="json") for s in io.outputs]
    runner = _litert_runner(path, threads, ins)
    names = [d["name"] for d in runner.outputs]
    order = [names.index(s["name"]) if s["name"] in names else k for k, s in enumerate(outs)]
    batch = model_batch([tuple(int(v) for v in d["shape"]) for d in runner.inputs]) or 1

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        prepared = [agent.tensors.prepare(x, s) for x, s in zip(feed, ins)]
        try:
            got = runner.run(prepared)
        except Exception as exc:  # the interpreter raises RuntimeError/ValueError naming the kernel and node
            msg = str(exc).strip().replace("\n", " ")[:400]
            quantized = any(str(d.get("dtype", "")).startswith(("int8", "uint8", "int16")) for d in runner.inputs) \
                or "quant" in msg.lower()
            if "mismatch" in msg.lower() or "shape" in msg.lower():
                hint = ("the interpreter's input shape does not match the data fed to it: check the input layout "
                        "(NCHW vs NHWC) and the static shapes the model was converted with (--input-shape)")
            elif quantized:
                hint = "a quantized kernel cannot handle this input range; try precision: fp16 or quantization: dynamic"
            else:
                hint = "run the .tflite on LiteRT alone to reproduce it; report the failing op with its converter route"
            raise ConversionError(f"the converted model fails on the LiteRT interpreter: {msg}", hop=HOP,
                                  hint=hint) from exc
        res = []
        for spec, j in zip(outs, order):
            y = got[j] if j < len(got) else got[-1]
            res.append(agent.tensors.restore_output(y, spec))
        return res

    return run_batched(once, list(xs), batch)


def run_tflite(path: Path, io: IOSpec, xs: list[np.ndarray], threads: int = 1) -> np.ndarray:
    """First output of a .tflite model on ``xs`` (user layout and dtype), exactly as the agent feeds it."""
    return run_tflite_all(path, io, xs, threads)[0]


def _tflite_details(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    r = _litert_runner(path, 1)
    return r.inputs, r.outputs


def _first_samples(xs: list[np.ndarray], k: int) -> list[np.ndarray]:
    """The first ``k`` samples of each input; inputs without a common sample axis stay whole."""
    return [np.asarray(x[:k]) for x in xs] if shares_samples(xs) else [np.asarray(x) for x in xs]


# ONNX ops whose usual TF lowering is a Flex op, and the onnx2tf pseudo-op replacement that avoids it
PSEUDO_OP_FIXES = {"Erf": "Erf", "Gelu": "GeLU", "Asin": "Asin", "Acos": "Acos", "Atan": "Atan"}


def _require_builtin_only(path: Path, ops: dict[str, list[str]]) -> None:
    """Fail, naming the TF op and the ONNX nodes behind it, when the graph needs TF Flex ops that a
    device's plain LiteRT interpreter cannot run."""
    try:
        _tflite_details(path)
    except ConversionError as exc:
        flex = sorted(set(re.findall(r"Flex(\w+)", exc.message)))
        if not flex:
            raise
        nodes = {f: ops.get(f) or ops.get(f.capitalize()) or [] for f in flex}
        named = "; ".join(f"{f}" + (f" (ONNX {f} at {', '.join(repr(n) for n in v[:5])})" if v else "")
                          for f, v in nodes.items())
        fix = [PSEUDO_OP_FIXES[o] for o in ops if o in PSEUDO_OP_FIXES]
        raise ConversionError(
            f"the converted graph needs TensorFlow Flex ops, which a device's LiteRT interpreter cannot run: {named}",
            hop=HOP, hint=(f"pseudo_ops: {fix} rebuilds them from builtin ops (the route fallback tries it)" if fix
                           else "replace that op in the PyTorch model, or keep the model on ONNX Runtime")) from exc

