"""Parsing REAL output of TFLite's benchmark_model (and LiteRT's benchmark_litert_model).

Every sample below was printed by the real tool on real hardware and published; each records where
it came from. The lines are as published (only trimmed to the part the parser reads, plus the lines
around it that it must ignore). "index id" = the id of the file in the public-code index the
samples were found with, for the files whose repository the index did not name.
"""

from __future__ import annotations

import pytest

from edgekit.agent.benchmark_model import benchmark_argv, parse_benchmark_output
from edgekit.errors import AgentError

# github.com/lp6m/yolov5s_android, benchmark/README.md (commit 7b789d1), "None(CPU)" fp32 run on a
# Xiaomi Mi11 via `adb shell /data/local/tmp/benchmark_model --graph=... --num_threads=4`.
# Older tool: no p5/median/p95, "Peak memory footprint"; the author kept only the run's stat line.
YOLO_MI11_CPU = """\
count=50 first=249042 curr=250889 min=247067 max=254474 avg=249684 std=1442
Inference timings in us: Init: 16242, First inference: 360262, Warmup (avg): 304586, Inference (avg): 249684
Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
Peak memory footprint (MB): init=4.92969 overall=138.809
"""

# same file, "NNAPI qti-default (Not working)": the tool fails.
YOLO_MI11_NNAPI_FAILED = """\
STARTING!
Log parameter values verbosely: [0]
Num threads: [4]
Graph: [/data/local/tmp/yolov5s_int8_640.tflite]
#threads used for CPU inference: [4]
Use NNAPI: [1]
NNAPI execution preference: [sustained_speed]
NNAPI accelerator name: [qti-default]
NNAPI accelerators available: [qti-default,qti-dsp,qti-gpu,nnapi-reference]
Loaded model /data/local/tmp/yolov5s_int8_640.tflite
INFO: Initialized TensorFlow Lite runtime.
INFO: Created TensorFlow Lite delegate for NNAPI.
ERROR: NN API returned error ANEURALNETWORKS_OP_FAILED at line 3779 while completing NNAPI compilation.

ERROR: Node number 248 (TfLiteNnapiDelegate) failed to prepare.

ERROR: Restored original execution plan after delegate application failure.
Failed to apply NNAPI delegate.
Benchmarking failed.
"""

# TI Processor SDK Linux docs, "TensorFlow Lite (LiteRT)" page (index id 53724242971), AM62x EVM,
# CPU only, --num_threads=4 --use_xnnpack=false. Newer tool: INFO: prefix, p5/median/p95,
# scientific notation, "Memory footprint delta".
TI_AM62X_CPU = """\
   INFO: The input model file size (MB): 67.3128
   INFO: Initialized session in 5.579ms.
   INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
   INFO: count=1 curr=1357602 p5=1357602 median=1357602 p95=1357602

   INFO: Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
   INFO: count=50 first=1249964 curr=1240143 min=1238588 max=1252566 avg=1.24027e+06 std=2565 p5=1238753 median=1239807 p95=1247415

   INFO: Inference timings in us: Init: 5579, First inference: 1357602, Warmup (avg): 1.3576e+06, Inference (avg): 1.24027e+06
   INFO: Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
   INFO: Memory footprint delta from the start of the tool (MB): init=6.36328 overall=109.832
"""

# An Android phone (OPPO A3x), benchmark output read from `adb logcat` (index id 66469876027): every
# line carries the logcat prefix.
OPPO_LOGCAT = """\
07-08 15:33:56.228 I/tflite  ( 5395): Initialized session in 458.883ms.
07-08 15:33:56.256 I/tflite  ( 5395): Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
07-08 15:33:58.992 I/tflite  ( 5395): count=1 curr=2732148 p5=2732148 median=2732148 p95=2732148
07-08 15:33:58.993 I/tflite  ( 5395): Running benchmark for at least 10 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
07-08 15:34:26.201 I/tflite  ( 5395): count=10 first=2653894 curr=2709263 min=2640862 max=3025403 avg=2.71985e+06 std=105101 p5=2640862 median=2709263 p95=3025403
07-08 15:34:26.202 I/tflite  ( 5395): Inference timings in us: Init: 458883, First inference: 2732148, Warmup (avg): 2.73215e+06, Inference (avg): 2.71985e+06
07-08 15:34:26.202 I/tflite  ( 5395): Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
07-08 15:34:26.202 I/tflite  ( 5395): Memory footprint delta from the start of the tool (MB): init=286.73 overall=337
"""

# i.MX8 snap docs (index id 8883724749), NNAPI on the vsi-npu: a warmup phase of one run prints
# "count=1 curr=..." only, and memory accounting reports init=0.
IMX8_NNAPI = """\
    Initialized session in 13.386ms.
    Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
    count=1 curr=11403859

    Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
    count=260 first=3918 curr=3711 min=3700 max=4026 avg=3756.87 std=35

    Inference timings in us: Init: 13386, First inference: 11403859, Warmup (avg): 1.14039e+07, Inference (avg): 3756.87
    Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
    Peak memory footprint (MB): init=0 overall=15.3438
"""

# same page, CPU run on the same board: memory accounting unsupported (0 MB).
IMX8_CPU_NO_MEMORY = """\
    Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
    count=3 first=217409 curr=210455 min=210455 max=217409 avg=213058 std=3096

    Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
    count=50 first=209891 curr=209739 min=209739 max=210599 avg=210028 std=221

    Inference timings in us: Init: 2517, First inference: 217409, Warmup (avg): 213058, Inference (avg): 210028
    Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
    Peak memory footprint (MB): init=0 overall=0
"""

# Notes of a run with the periodic memory monitor (index id 49195862036), as the author listed the
# lines (markdown bullets, backticks kept): no section headers, so phases are told apart by their averages.
PERIODIC_MONITOR = """\
    - `INFO: Initialized session in 3.337ms.`
    - `INFO: count=9 first=81913 curr=55502 min=55502 max=81913 avg=58984.7 std=8115`
    - `INFO: count=1061 first=56576 curr=56299 min=54669 max=60236 avg=56265.8 std=982`
    - `INFO: Inference timings in us: Init: 3337, First inference: 81913, Warmup (avg): 58984.7, Inference (avg): 56265.8`
    - `INFO: Overall peak memory footprint (MB) via periodic monitoring: 93.2383`
"""

# Arm learning path on KleidiAI SME2 (index id 9158267388): LiteRT's benchmark_litert_model with
# --use_profiler=true (the op profiler's "Timings (microseconds): count=..." line must be ignored).
LITERT_SME2 = """\
INFO: Initialized session in 4.478ms.
INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
INFO: count=1055 first=1033 curr=473 min=443 max=1033 avg=465.319 std=18 p5=459 median=463 p95=478

INFO: Running benchmark for at least 1000 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
INFO: count=2112 first=463 curr=459 min=442 max=979 avg=464.545 std=13 p5=460 median=462 p95=478

INFO: [./litert/tools/benchmark_litert_model.h:81] 
========== BENCHMARK RESULTS ==========
INFO: [./litert/tools/benchmark_litert_model.h:82] Model initialization: 4.48 ms
INFO: [./litert/tools/benchmark_litert_model.h:84] Warmup (first):       1.03 ms
INFO: [./litert/tools/benchmark_litert_model.h:86] Warmup (avg):         0.47 ms (1055 runs)
INFO: [./litert/tools/benchmark_litert_model.h:88] Inference (avg):      0.46 ms (2112 runs)
INFO: [./litert/tools/benchmark_litert_model.h:92] Inference (min):      0.44 ms
INFO: [./litert/tools/benchmark_litert_model.h:94] Inference (max):      0.98 ms
INFO: [./litert/tools/benchmark_litert_model.h:96] Inference (std):      0.01
INFO: [./litert/tools/benchmark_litert_model.h:103] Throughput:           525.55 MB/s
INFO: [./litert/tools/benchmark_litert_model.h:112] 
Memory Usage:
INFO: [./litert/tools/benchmark_litert_model.h:114] Init footprint:       8.94 MB
INFO: [./litert/tools/benchmark_litert_model.h:116] Overall footprint:    11.51 MB
INFO: [./litert/tools/benchmark_litert_model.h:123] Peak memory usage not available. (peak_mem_mb <= 0)
INFO: [./litert/tools/benchmark_litert_model.h:126] ======================================

Timings (microseconds): count=3166 first=947 curr=406 min=390 max=947 avg=411.071 std=14
Memory (bytes): count=0
5 nodes observed
"""


def test_old_tool_on_an_android_phone():
    r = parse_benchmark_output(YOLO_MI11_CPU)
    assert r.tool == "benchmark_model"
    assert r.init_ms == pytest.approx(16.242)
    assert r.first_inference_ms == pytest.approx(360.262)
    assert r.warmup_avg_ms == pytest.approx(304.586)
    assert r.inference_avg_ms == pytest.approx(249.684)
    assert r.inference.count == 50 and r.inference.min_ms == pytest.approx(247.067)
    assert r.inference.std_ms == pytest.approx(1.442)
    assert r.inference.median_ms is None  # this version prints no percentiles
    assert r.warmup is None  # the author's paste has no warmup stat line
    assert r.peak_memory_mb == pytest.approx(138.809)
    rep = r.to_report()
    assert rep["latency_ms"]["p50"] is None and "latency_ms.p50" in rep["unavailable"]
    assert rep["latency_ms"]["p90"] is None and "latency_ms.raw" in rep["unavailable"]
    assert rep["load_ms"] == pytest.approx(16.242) and rep["measured_by"] == "benchmark_model"


def test_failed_benchmark_is_an_agent_error_with_the_tools_reason():
    with pytest.raises(AgentError, match="ANEURALNETWORKS_OP_FAILED") as ei:
        parse_benchmark_output(YOLO_MI11_NNAPI_FAILED)
    assert ei.value.exit_code == 3
    assert "Benchmarking failed" in str(ei.value)


def test_newer_tool_percentiles_scientific_notation_and_delta_memory():
    r = parse_benchmark_output(TI_AM62X_CPU)
    assert r.inference_avg_ms == pytest.approx(1240.27)
    assert r.warmup_avg_ms == pytest.approx(1357.6)
    assert r.warmup.count == 1 and r.warmup.avg_ms == pytest.approx(1357.602)
    inf = r.inference
    assert (inf.count, inf.p5_ms, inf.median_ms, inf.p95_ms) == (50, pytest.approx(1238.753),
                                                                pytest.approx(1239.807), pytest.approx(1247.415))
    assert inf.avg_ms == pytest.approx(1240.27)
    # a delta from the tool's own start is not a peak: null with the reason, the figure kept aside
    assert r.peak_memory_mb is None
    assert r.memory["footprint_delta_overall_mb"] == pytest.approx(109.832)
    assert "delta" in r.unavailable["peak_memory_mb"]
    rep = r.to_report()
    assert rep["latency_ms"]["p50"] == pytest.approx(1239.807)
    assert rep["latency_ms"]["runs"] == 50 and rep["latency_ms"]["warmup"] == 1


def test_logcat_prefixed_output_from_an_android_phone():
    r = parse_benchmark_output(OPPO_LOGCAT)
    assert r.init_ms == pytest.approx(458.883)
    assert r.inference.count == 10 and r.inference.median_ms == pytest.approx(2709.263)
    assert r.inference.max_ms == pytest.approx(3025.403)
    assert r.memory["footprint_delta_overall_mb"] == pytest.approx(337.0)


def test_single_run_warmup_and_partial_memory_accounting():
    r = parse_benchmark_output(IMX8_NNAPI)
    assert r.warmup.count == 1 and r.warmup.avg_ms == pytest.approx(11403.859) and r.warmup.std_ms == 0.0
    assert r.inference.count == 260 and r.inference_avg_ms == pytest.approx(3.75687)
    assert r.peak_memory_mb == pytest.approx(15.3438)


def test_zero_memory_means_unsupported_not_zero():
    r = parse_benchmark_output(IMX8_CPU_NO_MEMORY)
    assert r.peak_memory_mb is None
    assert "not supported" in r.unavailable["peak_memory_mb"]
    assert r.warmup.count == 3 and r.inference.count == 50


def test_periodic_monitor_peak_and_phases_without_headers():
    r = parse_benchmark_output(PERIODIC_MONITOR)
    assert r.peak_memory_mb == pytest.approx(93.2383)
    assert r.inference.count == 1061 and r.warmup.count == 9


def test_litert_benchmark_tool_ignores_the_op_profiler():
    r = parse_benchmark_output(LITERT_SME2)
    assert r.tool == "benchmark_litert_model"
    assert r.init_ms == pytest.approx(4.48)
    assert r.inference.count == 2112  # not the profiler's count=3166
    assert r.inference.median_ms == pytest.approx(0.462)
    assert r.warmup.count == 1055
    assert r.peak_memory_mb is None and "not available" in r.unavailable["peak_memory_mb"]
    assert r.memory["overall_mb"] == pytest.approx(11.51)


def test_argv_pins_to_big_cores_when_asked():
    argv = benchmark_argv("/data/local/tmp/edgekit/bin/bm", "/data/local/tmp/edgekit/files/m.tflite", threads=4,
                          warmup=10, runs=50, min_seconds=1.0, pin_mask="f0")
    assert argv[:3] == ["taskset", "f0", "/data/local/tmp/edgekit/bin/bm"]
    assert "--graph=/data/local/tmp/edgekit/files/m.tflite" in argv and "--num_threads=4" in argv
    assert "--warmup_runs=10" in argv and "--num_runs=50" in argv and "--min_secs=1" in argv
