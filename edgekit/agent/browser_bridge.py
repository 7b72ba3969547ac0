"""The host half of the browser agent: an agent request in, the agent's answer out, the page measuring.

The data handling is the device agent's own code (``device_agents/edgekit_agent/``, loaded in process:
its ``tensors`` and ``streams`` modules: the eval shards, layout and dtype, the stream plan, padding a fixed batch), so the page sees
exactly the tensors the Python agent would feed its runner. The page (``device_agents/browser/agent.js``)
loads the model with ONNX Runtime Web, warms up, times the runs and the eval pass; its outputs come back
by upload and are written as the agent's outputs file. What the page cannot measure is null with its
reason: energy, the per-op profile; A/B blocks, sustained runs and streams with state are refused as the
request's fault (``bad_request``), naming what runs instead.
"""

from __future__ import annotations

import json
import os
import platform
import uuid
from pathlib import Path

from ..sim.procs import descendants
from .inprocess import load_agent

RUNTIME = "onnxruntime-web"
LITERT_JS = "litert.js"
# the page's runtimes: the registry's runtime -> (the format it runs, the name the report gives it)
PAGE_RUNTIMES = {"onnxruntime": ("onnx", RUNTIME), "litert": ("tflite", LITERT_JS)}
OPTIONS = {"graph_optimization_level": ("disable_all", "basic", "extended", "all"),
           "execution_mode": ("sequential", "parallel")}
# the runtime options each page runtime takes (LiteRT.js: none; its WASM CPU path is XNNPACK, not switchable)
PAGE_OPTIONS = {"onnxruntime": OPTIONS, "litert": {}}
_WEB_LEVEL = {"disable_all": "disabled", "basic": "basic", "extended": "extended", "all": "all"}
_NP_OF_WEB = {"float32": "float32", "float64": "float64", "int8": "int8", "uint8": "uint8", "int16": "int16",
              "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64",
              "bool": "bool", "float16": "float16"}


class _Refused(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# A CPU-throttled page (browser-mobile): DevTools slows the renderer by pausing its thread in slices, so a
# fast run either falls between pauses (full speed) or spans one; a timed sample spans this long (env
# EDGEKIT_THROTTLED_SAMPLE_MS) so each holds many slices and reads the throttled speed on average.
THROTTLED_SAMPLE_MS = float(os.environ.get("EDGEKIT_THROTTLED_SAMPLE_MS") or 100.0)


def _fail(kind: str, message: str) -> tuple[dict, int]:
    agent = load_agent()
    code = agent.EXIT_BAD_REQUEST if kind in ("bad_request", "bad_data", "integrity") else agent.EXIT_RUNTIME
    return {"protocol": agent.PROTOCOL, "agent_version": agent.AGENT_VERSION, "ok": False,
            "error": {"kind": kind, "message": message}}, code


def _facts(page, hello: dict) -> dict:
    facts = dict(load_agent().device.device_facts(), arch="wasm32", os="browser", host_arch=platform.machine(),
                 browser=f"Chromium {page.version}" if page.version else "Chromium", user_agent=hello.get("user_agent"))
    facts.pop("python", None)  # the page runs no Python
    facts["wasm"] = _features(hello)
    facts["page_agent"] = page.agent_sha256
    if hello.get("hardware_concurrency"):
        facts["cores"] = hello["hardware_concurrency"]
    if page.emulation_applied:  # browser-mobile: the page's CPU was slowed by DevTools (an emulation)
        facts["browser_emulation"] = dict(page.emulation_applied)
    return facts


def _features(hello: dict) -> dict:
    return {"wasm_simd": hello.get("wasm_simd"), "wasm_threads": hello.get("wasm_threads"),
            "cross_origin_isolated": hello.get("cross_origin_isolated")}


def probe_page(page) -> tuple[dict, int]:
    """``agent.py --probe`` in the browser: the page's facts and the runtime it has."""
    hello = page.open(page.threads or 1)
    agent = load_agent()
    return {"protocol": agent.PROTOCOL, "agent_version": agent.AGENT_VERSION, "ok": True, "device": _facts(page, hello),
            "device_state": agent.device.device_state(),
            "runtimes": {"onnxruntime": hello.get("ort_version"), **({"litert": page.litert_version} if page.litert else {})},
            "features": _features(hello)}, 0


def _check(req: dict, page) -> dict:
    """The request's options as the page applies them; what the page cannot do is refused by name."""
    runtime = req.get("runtime")
    if PAGE_RUNTIMES.get(runtime, (None,))[0] != req.get("format"):
        raise _Refused("runtime_missing", f"the browser agent runs ONNX models with ONNX Runtime Web and .tflite "
                       f"with LiteRT.js; {req.get('format')} ({runtime}) does not run in this page")
    if runtime == "litert" and page.litert is None:
        raise _Refused("runtime_missing", "LiteRT.js (@litertjs/core) is not installed for the browser agent: "
                       "bash .ci/install.sh installs it (npm ci in device_agents/browser)")
    for key, what in (("ab", "A/B blocks"), ("sustained", "a sustained run")):
        if req.get(key):
            raise _Refused("bad_request", f"{what} is not measured in the browser yet: measure it on a native target")
    if (req.get("stream") or {}).get("state"):
        raise _Refused("bad_request", "a stream with state (--state) is not run in the browser yet")
    if (req.get("warmup_mode") or "fixed") != "fixed":
        raise _Refused("bad_request", "the browser agent warms up a fixed number of runs (warmup_mode fixed)")
    opts, allowed = dict(req.get("runtime_options") or {}), PAGE_OPTIONS[runtime]
    for k, v in opts.items():
        if k not in allowed or v not in allowed[k]:
            name = PAGE_RUNTIMES[runtime][1]
            raise _Refused("bad_request", f"{name} takes {sorted(allowed)} with values {allowed}; got {k}={v!r}"
                           if allowed else f"{name} takes no runtime options in the page; got {k}={v!r}")
    return opts


def _litert_keys(agent, model: str, in_specs: list[dict], out_specs: list[dict]) -> tuple[list[str], list[str]]:
    """LiteRT.js feeds and returns tensors by the file's signature names ("x", "output_0"), not its tensor
    names (a file without signatures: its tensor names): the host's input specs and its output order
    (the Python runner's, by tensor name) mapped to them through the tensor indices, read with this
    host's LiteRT interpreter."""
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        it = Interpreter(model_path=model, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        graph_in, graph_out = it.get_input_details(), it.get_output_details()
        ins = agent.runners.LiteRTRunner.in_spec_order(graph_in, in_specs)
        outs = agent.runners.LiteRTRunner.in_spec_order(graph_out, out_specs)
        sigs = it.get_signature_list()
        if sigs:
            runner = it.get_signature_runner(next(iter(sigs)))
            key_in = {int(d["index"]): k for k, d in runner.get_input_details().items()}
            key_out = {int(d["index"]): k for k, d in runner.get_output_details().items()}
        else:  # a file without signatures: LiteRT.js names the default one's tensors by their tensor names
            key_in = {int(d["index"]): d["name"] for d in graph_in}
            key_out = {int(d["index"]): d["name"] for d in graph_out}
        return [key_in[int(d["index"])] for d in ins], [key_out[int(d["index"])] for d in outs]
    except _Refused:
        raise
    except (ImportError, ValueError, RuntimeError, KeyError) as exc:
        raise _Refused("model_load_failed", f"{LITERT_JS}: cannot read {model}'s signature on the host: {exc}") from exc


class _Tensors:
    """Prepared arrays served to the page by id (the bytes the page turns into ort.Tensor)."""

    def __init__(self, page, np):
        self.page, self.np, self.ids = page, np, []

    def spec(self, name: str, x, key: str | None = None) -> dict:
        x = self.np.ascontiguousarray(x)
        if x.dtype.name not in _NP_OF_WEB:
            raise _Refused("bad_data", f"input {name}: dtype {x.dtype} has no ONNX Runtime Web tensor type")
        tid = uuid.uuid4().hex
        self.page.tensors[tid] = x.tobytes()
        self.ids.append(tid)
        return {"name": name, "key": key or name, "dtype": x.dtype.name, "shape": list(x.shape),
                "url": f"/tensor/{tid}"}

    def drop(self) -> None:
        for tid in self.ids:
            self.page.tensors.pop(tid, None)


def _static_batch(specs: list[dict]) -> int | None:
    for s in specs:
        shape = s.get("shape") or []
        if shape and isinstance(shape[0], int) and shape[0] > 0:
            return shape[0]
    return None


def _browser_cpu_s(page) -> float:
    """CPU seconds the browser's processes have used (the page is the measured process, not "others")."""

    hz, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in [page.proc.pid, *descendants(page.proc.pid)] if page.proc else []:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / hz


def _others(busy, browser_s: float) -> float | None:
    """The agent's BusyMeter figure less the browser's own CPU time."""
    frac = busy.other_cpu_fraction()
    if frac is None:
        return None
    import time

    wall = time.perf_counter() - busy.t0
    return max(0.0, frac - browser_s / (wall * (os.cpu_count() or 1)))


def _renderer_peak_mb(page) -> tuple[float | None, str | None]:
    """Peak RSS (VmHWM) of the page's renderer process(es), reset before each job."""
    peaks = []
    for pid in page.renderer_pids():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024.0)
        except OSError:
            continue
    return (max(peaks), None) if peaks else (None, "no renderer process found to read VmHWM from")


def _reset_peaks(page) -> None:
    for pid in page.renderer_pids():
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            pass


def measure_in_page(page, request_path: str, timeout: float) -> tuple[dict, int]:
    """(the agent's JSON document, its exit code) for the request at ``request_path``."""
    import numpy as np

    agent = load_agent()
    try:
        with open(request_path, encoding="utf-8") as fh:
            req = json.load(fh)
    except (OSError, ValueError) as exc:
        return _fail("bad_request", f"cannot read request {request_path}: {exc}")
    tensors = _Tensors(page, np)
    try:
        opts = _check(req, page)
        model = req["model"]
        if req.get("model_sha256") and agent.hashing.model_sha256(model, req.get("companions")) != req["model_sha256"]:
            raise _Refused("integrity", f"model file {model} does not match its sha256 (corrupted transfer)")
        in_specs, out_specs = req["inputs"], req.get("outputs") or []
        runtime = req["runtime"]
        keys, out_keys = _litert_keys(agent, model, in_specs, out_specs) if runtime == "litert" else (None, None)
        plan = agent.streams.stream_plan(req, in_specs, out_specs)
        data_specs = agent.streams.data_specs(plan, in_specs)
        static = _static_batch(data_specs)
        ev = req.get("eval")
        bs = static or int((ev or {}).get("batch_size", 64))
        if ev and ev.get("buckets"):
            raise _Refused("bad_data", "the page scores eval data of one sample shape; this eval set holds "
                                 f"{len(ev['buckets'])} shape buckets (deploy the page once per shape)")
        if ev:
            shards = agent.tensors.load_eval(ev, data_specs)
            sample = [agent.tensors.pad(np.asarray(x[0:static or 1]), static or 1) for x in shards[0]]
        else:
            shards, sample = [], agent.tensors.synthetic_inputs(data_specs)

        def feed(chunk):
            xs = agent.streams.assemble(plan, chunk, agent.streams.zero_state(plan, in_specs))
            return [tensors.spec(s["name"], agent.tensors.prepare(x, s), keys[i] if keys else None)
                    for i, (x, s) in enumerate(zip(xs, in_specs))]

        batches, kept = [], []
        for xs in shards:
            for i in range(0, len(xs[0]), bs):
                chunk = [np.asarray(x[i:i + bs]) for x in xs]
                kept.append(len(chunk[0]))
                batches.append(feed([agent.tensors.pad(c, static) for c in chunk] if static else chunk))
        threads = int(req.get("threads", 1))
        hello = page.open(threads)
        job = {"kind": "measure", "id": uuid.uuid4().hex, "variant": req.get("variant"), "runtime": runtime,
               "output_keys": out_keys,
               "model_url": "/files/" + os.path.relpath(model, page.workdir),
               "options": {k: (_WEB_LEVEL[v] if k == "graph_optimization_level" else v) for k, v in opts.items()},
               "warmup": int(req.get("warmup", 10)), "runs": int(req.get("runs", 50)),
               "min_seconds": float(req.get("min_seconds", 1.0)), "max_runs": int(req.get("max_runs", 5000)),
               "max_seconds": float(req.get("max_seconds", 120.0)), "timed_inputs": feed(sample),
               "eval_batches": batches, "min_sample_ms": THROTTLED_SAMPLE_MS if page.emulation_applied else 0}
        job["upload_url"] = f"/upload/{job['id']}"
        state_before = agent.device.device_state()
        busy, browser0 = agent.device.BusyMeter(), _browser_cpu_s(page)
        _reset_peaks(page)
        got = page.run_job(job, timeout)
        other_cpu = _others(busy, _browser_cpu_s(page) - browser0)
        if not got.get("ok"):
            raise _Refused(got.get("kind", "inference_failed"), f"{PAGE_RUNTIMES[runtime][1]}: {got.get('message')}")
        peak_mb, peak_reason = _renderer_peak_mb(page)
        outputs_path = req.get("outputs_path")
        if shards:
            outs = _outputs(np, agent, page, job["id"], len(batches), got, out_specs, kept, static)
            if outputs_path:
                os.makedirs(os.path.dirname(outputs_path) or ".", exist_ok=True)
                tmp = outputs_path + ".partial.npz"
                np.savez(tmp, **{f"output_{i}": o for i, o in enumerate(outs)})
                os.replace(tmp, outputs_path)
    except _Refused as exc:
        return _fail(exc.kind, str(exc))
    except agent.AgentFailure as exc:
        return _fail(exc.kind, exc.message)
    finally:
        tensors.drop()
    warnings = agent.device.state_warnings(state_before, agent.device.device_state(), other_cpu)
    # what the page says it set (it reads the count from its URL once per load), not what was asked
    eff_threads = int(hello.get("threads") or 1) if hello.get("wasm_threads") else 1
    if eff_threads != threads:
        warnings.append(f"{threads} WASM threads requested, the page ran on {eff_threads}"
                        + ("" if hello.get("wasm_threads") else " (not cross-origin isolated: no WASM threads)"))
    mem = got.get("memory") or {}
    n = sum(len(sh[0]) for sh in shards)
    doc = {
        "protocol": agent.PROTOCOL, "agent_version": agent.AGENT_VERSION, "ok": True, "variant": req.get("variant"),
        "device": _facts(page, hello),
        "device_state": {"before": state_before, "after": agent.device.device_state(), "other_cpu_fraction": other_cpu},
        "runtime": {"name": PAGE_RUNTIMES[runtime][1], "version": hello.get("ort_version") if runtime == "onnxruntime"
                    else page.litert_version, "threads": eff_threads, "delegate": "wasm",
                    **({"options": opts} if opts else {}), "features": _features(hello)},
        "load_ms": got["load_ms"],
        "latency_ms": {"warmup": got["warmup"], "warmup_mode": "fixed", "runs": len(got["raw"]), "raw": got["raw"],
                       "raw_decimation": None, "iterations_per_sample": got["iterations_per_sample"],
                       "timer_resolution_ms": got["timer_resolution_ms"]},
        "sustained": None,
        "memory": {"peak_rss_mb": peak_mb, "source": "renderer VmHWM" if peak_mb is not None else None,
                   "reason": peak_reason, "pss_mb": None, "arena_mb": None,
                   "arena_reason": f"{PAGE_RUNTIMES[runtime][1]} does not expose its arena size", **mem},
        "energy": agent.energy.no_energy(["not readable from a browser page"], (req.get("energy") or {}).get("sources")),
        "warnings": warnings,
        "eval": {"samples": n, "batch_size": bs, "static_batch": static,
                 "seconds": got.get("eval_seconds")} if shards else None,
        "outputs_path": outputs_path if shards else None,
    }
    if req.get("profile"):
        doc["op_profile"] = agent.runners.base.no_op_profile(f"{PAGE_RUNTIMES[runtime][1]} has no per-op profiler the page can read")
    return doc, 0


def _outputs(np, agent, page, jid, n_batches, got, out_specs, kept, static) -> list:
    """The uploaded outputs, per output in the user's layout, the fixed batch's padding dropped."""
    per_output = [[] for _ in got.get("output_names") or []]
    for b in range(n_batches):
        for o in range(len(per_output)):
            up = page.uploads.get(f"{jid}/{b}/{o}")
            if up is None:
                raise _Refused("inference_failed", f"the page did not return output {o} of eval batch {b}")
            dtype, shape, body = up
            y = np.frombuffer(body, dtype=_NP_OF_WEB.get(dtype, "float32")).reshape(shape)
            y = agent.tensors.restore_output(y, out_specs[o] if o < len(out_specs) else None)
            per_output[o].append(y[:kept[b]] if static and y.ndim and len(y) == static else y)
    return [np.concatenate(parts, axis=0) for parts in per_output]
