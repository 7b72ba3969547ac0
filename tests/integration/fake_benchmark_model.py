#!/usr/bin/env python3
"""A FAKE `benchmark_model` for the ADB tests: no real TFLite benchmark binary can run on this host
(it is the user's to supply, and edgekit never downloads it). It checks its arguments the way the
real tool needs them, records them (and its CPU affinity) beside the model, and replays a REAL
published output of the tool (tests/unit/test_benchmark_model_parse.py: TI_AM62X_CPU, TI Processor
SDK docs) on stderr, where the real tool logs. With EDGEKIT_FAKE_BM_FAIL in the model's folder it
replays the real failure output (YOLO_MI11_NNAPI_FAILED) and exits 1, as the real tool does.
"""

import json
import os
import sys

REAL_OK = """\
INFO: STARTING!
INFO: Initialized session in 5.579ms.
INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
INFO: count=1 curr=1357602 p5=1357602 median=1357602 p95=1357602

INFO: Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
INFO: count=50 first=1249964 curr=1240143 min=1238588 max=1252566 avg=1.24027e+06 std=2565 p5=1238753 median=1239807 p95=1247415

INFO: Inference timings in us: Init: 5579, First inference: 1357602, Warmup (avg): 1.3576e+06, Inference (avg): 1.24027e+06
INFO: Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
INFO: Memory footprint delta from the start of the tool (MB): init=6.36328 overall=109.832
"""
REAL_FAIL = """\
INFO: Created TensorFlow Lite delegate for NNAPI.
ERROR: NN API returned error ANEURALNETWORKS_OP_FAILED at line 3779 while completing NNAPI compilation.
ERROR: Node number 248 (TfLiteNnapiDelegate) failed to prepare.
Failed to apply NNAPI delegate.
Benchmarking failed.
"""

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
graph = args.get("graph")
if not graph or not os.path.isfile(graph):
    print(f"ERROR: Please specify the name of your TF Lite input file with --graph ({graph!r})", file=sys.stderr)
    sys.exit(1)
with open(graph, "rb") as fh:
    if fh.read(8)[4:8] != b"TFL3":
        print(f"ERROR: Could not build model from {graph}: not a TFLite flatbuffer", file=sys.stderr)
        sys.exit(1)
folder = os.path.dirname(graph)
with open(os.path.join(folder, "fake_benchmark_model.args.json"), "w") as fh:
    json.dump({"argv": sys.argv[1:], "affinity": sorted(os.sched_getaffinity(0))}, fh)
if os.path.exists(os.path.join(folder, "EDGEKIT_FAKE_BM_FAIL")):
    sys.stderr.write(REAL_FAIL)
    sys.exit(1)
sys.stderr.write(REAL_OK)
