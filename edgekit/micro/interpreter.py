"""TFLite Micro's interpreter (the ``tflite-micro`` wheel: TFLM's own reference kernels, built for this host) run in
a child process (``tflm_child.py``, which imports no edgekit), because a too-small arena can crash TFLM rather than
fail: the smallest arena that allocates, found by bisection, and the eval set's outputs through TFLM's kernels. The
inputs are put in the file's layout and int8 encoding by the agent's own ``tensors.prepare`` and the outputs taken
back by ``tensors.restore_output``, as for every other runtime."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..agent.inprocess import load_agent
from ..artifact import IOSpec
from ..errors import ConversionError
from .tflite_graph import read_graph

CHILD = Path(__file__).with_name("tflm_child.py")
# what the wheel's interpreter is: its figures are the part's kernels' and allocator's, its timing is not the part's
RUNTIME = "tflite-micro (host build, TFLM reference kernels)"


@dataclass(frozen=True)
class Arena:
    bytes: int  # the smallest arena the interpreter allocates the model in
    largest_failing: int  # bytes - 1: checked to fail
    head: int | None  # the recording allocator's head (non-persistent, planned activations) at that size
    tail: int | None  # its tail (persistent: tensor structs, kernels' persistent buffers)
    recorded_total: int | None  # head + tail as the recording allocator reports them
    probes: int  # interpreter builds the bisection made

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "largest_failing": self.largest_failing, "head": self.head, "tail": self.tail,
                "recorded_total": self.recorded_total, "probes": self.probes,
                "how": "bisection to the byte over TFLM interpreter builds, each in a forked process; head and tail "
                "from its RecordingMicroAllocator after one invoke. The wheel's interpreter keeps the recording "
                "allocator's own records in the arena, so a firmware's plain MicroAllocator needs up to that "
                "difference (bytes - recorded_total) less"}


def _child(args: list[str], timeout: float) -> dict[str, Any]:
    try:
        res = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=timeout,
                             check=False)
    except subprocess.TimeoutExpired as exc:
        raise ConversionError(f"TFLite Micro did not finish {args[0]} in {timeout:.0f} s", hop="tflite->tflm",
                              hint="a model this slow on the host is far too large for a microcontroller") from exc
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise ConversionError(f"the TFLite Micro interpreter died ({args[0]}, exit {res.returncode}): "
                              f"{res.stderr.strip()[-400:]}", hop="tflite->tflm",
                              hint="the model has an op or tensor type TFLM cannot run; see the message above")
    doc: dict[str, Any] = json.loads(lines[-1])
    if not doc.get("ok"):
        raise ConversionError(f"TFLite Micro refused the model: {doc.get('error')}", hop="tflite->tflm",
                              hint="an op or a tensor type TFLM's kernels do not handle; see the op list")
    return doc


def smallest_arena(model: Path, timeout: float = 300.0) -> Arena:
    """The smallest tensor arena (bytes) in which TFLM's interpreter allocates ``model``."""
    doc = _child(["arena", str(model)], timeout)
    rec = doc.get("recorded") or {}
    return Arena(bytes=int(doc["arena_bytes"]), largest_failing=int(doc["largest_failing"]), head=rec.get("head"),
                 tail=rec.get("tail"), recorded_total=rec.get("total"), probes=int(doc["probes"]))


def run_tflm(model: Path, arena: int, io: IOSpec, xs: list[np.ndarray], timeout: float = 600.0) -> list[np.ndarray]:
    """Every output of ``model`` on ``xs`` (the user's layout, float), run by TFLM with an ``arena``-byte arena, in
    ``io.outputs`` order, dequantized and in the user's layout."""
    agent = load_agent()
    ins = [s.model_dump(mode="json") for s in io.inputs]
    outs = [s.model_dump(mode="json") for s in io.outputs]
    with tempfile.TemporaryDirectory(prefix="edgekit-tflm-") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, **{f"input_{k}": agent.tensors.prepare(x, s) for k, (x, s) in enumerate(zip(xs, ins))})
        _child(["run", str(model), str(arena), str(src), str(dst)], timeout)
        with np.load(dst) as got:
            raw = [got[f"output_{j}"] for j in range(len(got.files))]
    names = list(read_graph(model.read_bytes()).output_names)  # TFLM's outputs, in the subgraph's order
    order = [names.index(s["name"]) if s["name"] in names else k for k, s in enumerate(outs)]
    return [np.asarray(agent.tensors.restore_output(raw[j], spec)) for spec, j in zip(outs, order)]
