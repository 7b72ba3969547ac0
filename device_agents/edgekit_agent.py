#!/usr/bin/env python3
"""edgekit's on-device agent.

Runs ON the device with only Python 3 (stdlib) and the runtime it drives (onnxruntime, or the
LiteRT interpreter; both bring numpy). It never imports edgekit.

    python3 edgekit_agent.py REQUEST.json          # measure one model variant
    python3 edgekit_agent.py --probe               # what this device is and can run
    python3 edgekit_agent.py --sha256 FILE...      # hashes of files (content-addressed delivery)

It prints exactly one JSON document on stdout; logs go to stderr. Raw per-run timings are
returned; the host computes the statistics. Exit codes: 0 ok, 2 bad request or data,
4 runtime missing or model failed to load/run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time

AGENT_VERSION = "0.1.0"
PROTOCOL = 1

EXIT_BAD_REQUEST = 2
EXIT_RUNTIME = 4


class AgentFailure(Exception):
    def __init__(self, kind, message, exit_code):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exit_code = exit_code


def log(msg):
    print(f"[edgekit-agent] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- device facts
def _read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default


def _cpu_model():
    text = _read("/proc/cpuinfo", "") or ""
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("model name", "hardware", "cpu model", "processor") and ":" in line:
            value = line.split(":", 1)[1].strip()
            if value and not value.isdigit():
                return value
    return platform.processor() or None


def _temperatures_c(root="/"):
    """Every thermal zone's temperature in degrees C (kernel reports millidegrees)."""
    base = os.path.join(root, "sys/class/thermal")
    temps = {}
    try:
        zones = sorted(z for z in os.listdir(base) if z.startswith("thermal_zone"))
    except OSError:
        return temps
    for z in zones:
        raw = _read(os.path.join(base, z, "temp"))
        if raw is None:
            continue
        try:
            kind = _read(os.path.join(base, z, "type"), z)
            temps[kind] = int(raw) / 1000.0
        except ValueError:
            continue
    return temps


def device_state():
    cpu0 = "/sys/devices/system/cpu/cpu0/cpufreq"
    freq = _read(os.path.join(cpu0, "scaling_cur_freq"))
    temps = _temperatures_c()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "governor": _read(os.path.join(cpu0, "scaling_governor")),
        "frequency_mhz": int(freq) / 1000.0 if freq and freq.isdigit() else None,
        "temperature_c": max(temps.values()) if temps else None,
        "temperatures_c": temps,
        "loadavg": list(load) if load else None,
    }


def device_facts():
    return {
        "arch": platform.machine(),
        "os": platform.system().lower(),
        "os_release": platform.release(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "hostname": platform.node(),
    }


def available_runtimes():
    found = {}
    try:
        import onnxruntime  # noqa: F401

        found["onnxruntime"] = onnxruntime.__version__
    except Exception as exc:  # a broken install is reported, not fatal
        log(f"onnxruntime unavailable: {exc}")
    for mod in ("ai_edge_litert", "tflite_runtime"):
        try:
            m = __import__(mod)
            found["litert"] = f"{mod} {getattr(m, '__version__', '?')}"
            break
        except Exception:
            continue
    return found


# --------------------------------------------------------------------------- memory
def memory_mb():
    """(current RSS, peak RSS) of this process in MB; VmHWM on Linux/Android, else getrusage."""
    status = _read("/proc/self/status")
    if status:
        vals = {}
        for line in status.splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                vals[k] = int(v.split()[0]) / 1024.0
        if "VmHWM" in vals:
            return vals.get("VmRSS"), vals["VmHWM"], "VmHWM"
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0
        return None, peak_mb, "ru_maxrss"
    except Exception:
        return None, None, None


# --------------------------------------------------------------------------- energy
def energy_unavailable_reason(sources, sysfs_root="/"):
    """Energy readers arrive with the measurement work; until a source is read, say why not."""
    checked = []
    for src in sources or []:
        if src == "rapl":
            p = os.path.join(sysfs_root, "sys/class/powercap")
            checked.append(f"rapl ({p}: {'present' if os.path.isdir(p) else 'absent'})")
        elif src == "hwmon":
            p = os.path.join(sysfs_root, "sys/class/hwmon")
            checked.append(f"hwmon ({p}: {'present' if os.path.isdir(p) else 'absent'})")
        else:
            checked.append(f"{src} (not configured)")
    if not checked:
        return "the target lists no energy source"
    return "no readable energy source: checked " + ", ".join(checked)


# --------------------------------------------------------------------------- runners
class OnnxRunner:
    name = "onnxruntime"

    def __init__(self, model_path, threads):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise AgentFailure("runtime_missing", f"onnxruntime is not installed on this device ({exc})",
                               EXIT_RUNTIME) from exc
        self.version = ort.__version__
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"onnxruntime cannot load {model_path}: {exc}",
                               EXIT_RUNTIME) from exc
        self.threads = int(threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_shapes = [list(i.shape) for i in self.session.get_inputs()]

    def batch_dynamic(self):
        return all(not isinstance(s[0], int) for s in self.input_shapes if s)

    def run(self, feeds):
        return self.session.run(None, dict(zip(self.input_names, feeds)))


class LiteRTRunner:
    name = "litert"

    def __init__(self, model_path, threads):
        Interpreter = None
        for mod in ("ai_edge_litert.interpreter", "tflite_runtime.interpreter"):
            try:
                Interpreter = __import__(mod, fromlist=["Interpreter"]).Interpreter
                self.module = mod.split(".")[0]
                break
            except ImportError:
                continue
        if Interpreter is None:
            raise AgentFailure("runtime_missing",
                               "no LiteRT interpreter on this device (ai_edge_litert or tflite_runtime)",
                               EXIT_RUNTIME)
        top = sys.modules.get(self.module)
        self.version = f"{self.module} {getattr(top, '__version__', '?')}"
        try:
            self.interp = Interpreter(model_path=model_path, num_threads=int(threads))
            self.interp.allocate_tensors()
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"LiteRT cannot load {model_path}: {exc}", EXIT_RUNTIME) from exc
        self.threads = int(threads)
        self.inputs = self.interp.get_input_details()
        self.outputs = self.interp.get_output_details()
        self._batch = None

    def batch_dynamic(self):
        return False  # TFLite graphs are fed one sample at a time (fixed batch 1 is the norm)

    def run(self, feeds):
        for det, x in zip(self.inputs, feeds):
            self.interp.set_tensor(det["index"], x)
        self.interp.invoke()
        return [self.interp.get_tensor(o["index"]) for o in self.outputs]


RUNNERS = {"onnxruntime": OnnxRunner, "litert": LiteRTRunner}


# --------------------------------------------------------------------------- data
def _prepare(np, x, spec):
    """User data (as the source model takes it) -> what this runtime's tensor takes."""
    if spec.get("transpose"):
        x = np.transpose(x, spec["transpose"])
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu" and spec.get("scale"):
        info = np.iinfo(dtype)
        q = np.round(x / spec["scale"] + spec.get("zero_point", 0))
        x = np.clip(q, info.min, info.max)
    return np.ascontiguousarray(x.astype(dtype, copy=False))


def _restore_output(np, y, spec):
    y = np.asarray(y)
    if spec and spec.get("scale") and y.dtype.kind in "iu":
        y = (y.astype(np.float32) - spec.get("zero_point", 0)) * spec["scale"]
    if spec and spec.get("transpose"):
        inv = [0] * len(spec["transpose"])
        for i, p in enumerate(spec["transpose"]):
            inv[p] = i
        y = np.transpose(y, inv)
    return y.astype(np.float32, copy=False)


def load_eval(np, ev, input_specs):
    path = ev["path"]
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise AgentFailure("bad_data", f"cannot read eval data {path}: {exc}", EXIT_BAD_REQUEST) from exc
    x_keys = ev.get("x_keys") or ["x"]
    missing = [k for k in x_keys + ([ev["y_key"]] if ev.get("y_key") else []) if k not in data.files]
    if missing:
        raise AgentFailure("bad_data", f"eval data {path} has no key(s) {missing}; it has {data.files}",
                           EXIT_BAD_REQUEST)
    xs = [np.asarray(data[k]) for k in x_keys]
    y = np.asarray(data[ev["y_key"]]) if ev.get("y_key") else None
    if len(xs) != len(input_specs):
        raise AgentFailure("bad_data", f"model takes {len(input_specs)} inputs, eval data gives {len(xs)}",
                           EXIT_BAD_REQUEST)
    return xs, y


def synthetic_inputs(np, input_specs):
    rng = np.random.default_rng(0)
    xs = []
    for spec in input_specs:
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec["shape"]]
        dt = np.dtype(spec.get("source_dtype") or "float32")
        if dt.kind == "f":
            xs.append(rng.standard_normal(shape).astype(dt))
        else:
            xs.append(rng.integers(0, 2, size=shape).astype(dt))
    return xs


# --------------------------------------------------------------------------- measurement
def measure(req):
    import numpy as np

    model = req["model"]
    if req.get("model_sha256"):
        got = sha256(model)
        if got != req["model_sha256"]:
            raise AgentFailure("integrity", f"model file {model} has sha256 {got[:12]}..., expected "
                               f"{req['model_sha256'][:12]}... (corrupted transfer)", EXIT_BAD_REQUEST)
    runtime = req["runtime"]
    if runtime not in RUNNERS:
        raise AgentFailure("bad_request", f"unknown runtime {runtime!r}; known: {sorted(RUNNERS)}", EXIT_BAD_REQUEST)
    in_specs = req["inputs"]
    out_specs = req.get("outputs") or []

    state_before = device_state()
    rss0, _, _ = memory_mb()
    t0 = time.perf_counter()
    runner = RUNNERS[runtime](model, req.get("threads", 1))
    load_ms = (time.perf_counter() - t0) * 1000.0
    rss1, _, _ = memory_mb()

    ev = req.get("eval")
    if ev:
        xs, y = load_eval(np, ev, in_specs)
        n = len(xs[0])
        if any(len(x) != n for x in xs):
            raise AgentFailure("bad_data", "eval inputs have different sample counts", EXIT_BAD_REQUEST)
        sample = [x[0:1] for x in xs]
    else:
        xs, y, n = None, None, 0
        sample = synthetic_inputs(np, in_specs)
    feeds = [_prepare(np, x, s) for x, s in zip(sample, in_specs)]

    try:
        warmup = int(req.get("warmup", 10))
        for _ in range(warmup):
            runner.run(feeds)
        min_runs = int(req.get("runs", 50))
        min_s = float(req.get("min_seconds", 1.0))
        max_runs = int(req.get("max_runs", 5000))
        max_s = float(req.get("max_seconds", 120.0))
        raw = []
        clock = time.perf_counter_ns
        started = time.perf_counter()
        while True:
            a = clock()
            runner.run(feeds)
            raw.append((clock() - a) / 1e6)
            elapsed = time.perf_counter() - started
            if len(raw) >= max_runs or elapsed >= max_s:
                break
            if len(raw) >= min_runs and elapsed >= min_s:
                break
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runtime} failed to run the model: {exc}", EXIT_RUNTIME) from exc
    _, peak_mb, mem_source = memory_mb()
    state_after = device_state()

    accuracy = None
    outputs_path = req.get("outputs_path")
    if xs is not None:
        bs = int(ev.get("batch_size", 64)) if runner.batch_dynamic() else 1
        outs = []
        try:
            for i in range(0, n, bs):
                batch = [_prepare(np, x[i:i + bs], s) for x, s in zip(xs, in_specs)]
                o = runner.run(batch)[0]
                outs.append(_restore_output(np, o, out_specs[0] if out_specs else None))
        except Exception as exc:
            raise AgentFailure("inference_failed", f"{runtime} failed on the eval set: {exc}", EXIT_RUNTIME) from exc
        logits = np.concatenate(outs, axis=0)
        if y is not None:
            pred = logits.reshape(len(logits), -1).argmax(axis=1)
            yy = y.reshape(-1).astype(np.int64)
            if len(yy) != len(pred):
                raise AgentFailure("bad_data", f"eval labels: {len(yy)} for {len(pred)} samples", EXIT_BAD_REQUEST)
            accuracy = {"metric": "top1", "value": float((pred == yy).mean() * 100.0), "n": int(len(yy))}
        if outputs_path:
            os.makedirs(os.path.dirname(outputs_path) or ".", exist_ok=True)
            tmp = outputs_path + ".partial.npy"
            np.save(tmp, logits)
            os.replace(tmp, outputs_path)

    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "variant": req.get("variant"),
        "device": device_facts(),
        "device_state": {"before": state_before, "after": state_after},
        "runtime": {"name": runner.name, "version": runner.version, "threads": runner.threads, "delegate": None},
        "load_ms": load_ms,
        "latency_ms": {"warmup": warmup, "runs": len(raw), "raw": raw},
        "memory": {
            "peak_rss_mb": peak_mb,
            "source": mem_source,
            "rss_before_load_mb": rss0,
            "rss_after_load_mb": rss1,
            "load_delta_mb": (rss1 - rss0) if (rss0 is not None and rss1 is not None) else None,
        },
        "energy": {
            "energy_mj_per_inference": None,
            "source": None,
            "reason": energy_unavailable_reason((req.get("energy") or {}).get("sources"),
                                                (req.get("energy") or {}).get("sysfs_root", "/")),
        },
        "accuracy": accuracy,
        "outputs_path": outputs_path if xs is not None else None,
    }


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def probe():
    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "device": device_facts(),
        "device_state": device_state(),
        "runtimes": available_runtimes(),
    }


def main(argv):
    try:
        if len(argv) == 2 and argv[1] == "--probe":
            doc = probe()
        elif len(argv) >= 2 and argv[1] == "--sha256":
            doc = {"protocol": PROTOCOL, "ok": True,
                   "sha256": {p: (sha256(p) if os.path.isfile(p) else None) for p in argv[2:]}}
        elif len(argv) == 2 and argv[1] == "--version":
            doc = {"protocol": PROTOCOL, "agent_version": AGENT_VERSION, "ok": True}
        elif len(argv) == 2:
            try:
                with open(argv[1], encoding="utf-8") as fh:
                    req = json.load(fh)
            except (OSError, ValueError) as exc:
                raise AgentFailure("bad_request", f"cannot read request {argv[1]}: {exc}", EXIT_BAD_REQUEST) from exc
            if req.get("protocol") != PROTOCOL:
                raise AgentFailure("bad_request", f"request protocol {req.get('protocol')} != agent protocol "
                                   f"{PROTOCOL}", EXIT_BAD_REQUEST)
            doc = measure(req)
        else:
            raise AgentFailure("usage", "usage: edgekit_agent.py REQUEST.json | --probe | --sha256 FILE... | --version", EXIT_BAD_REQUEST)
    except AgentFailure as exc:
        print(json.dumps({"protocol": PROTOCOL, "agent_version": AGENT_VERSION, "ok": False,
                          "error": {"kind": exc.kind, "message": exc.message}}))
        return exc.exit_code
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
