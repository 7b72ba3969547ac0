"""Load and run a .tflite once, on zeros: ``python -c <this file's text> MODEL.tflite`` prints ``ok``
(``host_harness.probe_litert`` runs it in a child process, so a LiteRT kernel that aborts kills the child, not
edgekit). Stdlib, numpy and LiteRT only: it never imports edgekit.

XNNPACK (applied by default) can refuse a graph at prepare ("Node number 3 (TfLiteXNNPackDelegate) failed to
prepare", seen on full-integer INT8 files); the agent then runs it on LiteRT's built-in kernels and says so
(LiteRTRunner), so the probe does the same: such a file is not a crash."""

import sys

import numpy as np
from ai_edge_litert import interpreter as lite


def run(path: str, **kw: object) -> None:
    it = lite.Interpreter(model_path=path, num_threads=1, **kw)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()


if __name__ == "__main__":
    try:
        run(sys.argv[1])
    except Exception as exc:
        low = str(exc).lower()
        if not ("xnnpack" in low and ("prepare" in low or "delegate" in low)):
            raise
        run(sys.argv[1], experimental_op_resolver_type=lite.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    print("ok")
