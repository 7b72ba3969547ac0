"""Run in a child process as ``python -c`` text (it imports no edgekit): TFLite Micro's interpreter on one model.

``arena MODEL``: the smallest arena that allocates, by bisection, each try in a forked process (a too-small arena
can crash TFLM); then the recording allocator's head/tail at that size, after one invoke. ``run MODEL ARENA IN OUT``:
every sample of IN (.npz of input_0.. already in the file's dtype and layout) through the interpreter, the raw
outputs to OUT (.npz output_0..). Prints one JSON document on stdout."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from typing import Any, Callable

import numpy as np
from tflite_micro.python.tflite_micro import runtime

CAP = 1 << 30  # no microcontroller has a GiB of SRAM: a model that needs more fails here


def _interp(model: bytes, size: int) -> Any:
    return runtime.Interpreter.from_bytes(model, arena_size=size)


def _in_fork(fn: Callable[[], object], stderr_path: str = os.devnull) -> bool:
    pid = os.fork()
    if pid == 0:  # the child: TFLM's messages go to stderr_path; the exit code is the verdict
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        try:
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _allocates(model: bytes, size: int) -> bool:
    return _in_fork(lambda: _interp(model, size))


def _zeros(it: Any, k: int) -> Any:
    d = it.get_input_details(k)
    return np.zeros([int(v) for v in d["shape"]], dtype=d["dtype"])


def _n_inputs(model: bytes) -> tuple[int, int]:
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    m = schema.Model.GetRootAsModel(bytearray(model), 0)
    sub = m.Subgraphs(0)
    return int(sub.InputsLength()), int(sub.OutputsLength())


def arena(model: bytes) -> dict[str, Any]:
    hi = max(4096, len(model))
    tries: list[list[Any]] = []
    while not _allocates(model, hi):
        tries.append([hi, False])
        if hi >= CAP:
            return {"ok": False, "error": f"TFLM could not allocate the model in {CAP} bytes", "tries": tries}
        hi = min(hi * 2, CAP)
    lo = 0  # fails (an empty arena holds nothing)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = _allocates(model, mid)
        tries.append([mid, ok])
        if ok:
            hi = mid
        else:
            lo = mid
    n_in, _ = _n_inputs(model)
    log = tempfile.mktemp(prefix="edgekit-tflm-")

    def record() -> None:
        it = _interp(model, hi)
        for k in range(n_in):
            it.set_input(_zeros(it, k), k)
        it.invoke()
        it.print_allocations()

    invoked = _in_fork(record, log)
    text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
    if os.path.exists(log):
        os.unlink(log)
    rec = {k: int(v) for k, v in re.findall(r"Arena allocation (total|head|tail) (\d+) bytes", text)}
    return {"ok": True, "arena_bytes": hi, "largest_failing": lo, "invoked": invoked, "recorded": rec,
            "probes": len(tries)}


def run(model: bytes, size: int, src: str, dst: str) -> dict[str, Any]:
    it = _interp(model, size)
    n_in, n_out = _n_inputs(model)
    data = np.load(src)
    xs = [data[f"input_{k}"] for k in range(n_in)]
    batch = [int(it.get_input_details(k)["shape"][0]) for k in range(n_in)]
    outs: list[list[Any]] = [[] for _ in range(n_out)]
    n = len(xs[0])
    for s in range(0, n, batch[0]):
        for k in range(n_in):
            x = xs[k][s:s + batch[k]]
            if len(x) < batch[k]:  # a fixed batch: pad with the last sample, dropped below
                x = np.concatenate([x, np.repeat(x[-1:], batch[k] - len(x), axis=0)])
            it.set_input(np.ascontiguousarray(x), k)
        it.invoke()
        for j in range(n_out):
            outs[j].append(np.array(it.get_output(j)))
    got = {f"output_{j}": np.concatenate(o)[:n] for j, o in enumerate(outs)}
    np.savez(dst, **got)  # type: ignore[arg-type]
    return {"ok": True, "samples": n, "outputs": n_out}


def main() -> None:
    cmd, path = sys.argv[1], sys.argv[2]
    model = open(path, "rb").read()
    try:
        doc = arena(model) if cmd == "arena" else run(model, int(sys.argv[3]), sys.argv[4], sys.argv[5])
    except Exception as exc:  # one JSON document whatever happens: the host turns it into its error
        doc = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
