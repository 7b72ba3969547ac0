// edgekit's browser agent (the page half). The host half is edgekit/agent/browser_transport.py: it serves this
// page, the runtime and the files on loopback, turns the agent request into a job (the model's URL, the
// prepared input tensors for the timed runs and for each eval batch) and builds the agent's answer from what
// this page returns. Here: load the model with ONNX Runtime Web (WASM), warm up, time runs with
// performance.now (whose resolution the page measures: 5 us when cross-origin isolated, 100 us otherwise;
// a fast model is timed in batches of iterations so one sample spans >= 200 ticks), read the memory the
// page can see, run every eval batch and upload its outputs for the host to score. No network beyond the
// page's own origin.
"use strict";

const PARAMS = new URLSearchParams(location.search);
const THREADS = Math.max(1, parseInt(PARAMS.get("threads") || "1", 10));

function log(msg) {
  document.getElementById("log").textContent += "\n" + msg;
}

// WebAssembly SIMD: a module using v128 validates only where the engine has SIMD (wasm-feature-detect's test)
const SIMD = WebAssembly.validate(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0,
  10, 10, 1, 8, 0, 65, 0, 253, 15, 253, 98, 11]));
const WASM_THREADS = typeof SharedArrayBuffer !== "undefined" && self.crossOriginIsolated === true;

ort.env.wasm.wasmPaths = "/ort/";
ort.env.wasm.numThreads = THREADS;
ort.env.wasm.proxy = false;

function timerResolutionMs() {
  let best = Infinity;
  for (let i = 0; i < 2000; i++) {
    const a = performance.now();
    let b = performance.now();
    while (b === a) b = performance.now();
    best = Math.min(best, b - a);
  }
  return best;
}

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array,
  uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array, int64: BigInt64Array, uint64: BigUint64Array,
  bool: Uint8Array, float16: Uint16Array,
};

async function fetchBytes(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`GET ${url}: HTTP ${r.status}`);
  return await r.arrayBuffer();
}

// The page's runtimes, one runner each: load(job) -> {run(feeds), outputs(result) -> [{data, dtype, dims}] in
// the job's output order, release()}; feeds(specs) builds the runtime's input tensors from the served bytes.
async function ortRunner(job) {
  const sessOpts = {executionProviders: ["wasm"], graphOptimizationLevel: job.options.graph_optimization_level || "all",
    executionMode: job.options.execution_mode || "sequential"};
  const session = await ort.InferenceSession.create(new Uint8Array(await fetchBytes(job.model_url)), sessOpts);
  return {
    async feeds(specs) {
      const out = {};
      for (const s of specs) {
        const Arr = ARRAYS[s.dtype];
        if (!Arr) throw new Error(`input ${s.name}: dtype ${s.dtype} has no ONNX Runtime Web tensor type`);
        out[s.name] = new ort.Tensor(s.dtype, new Arr(await fetchBytes(s.url)), s.shape);
      }
      return out;
    },
    run: (x) => session.run(x),
    free: null,
    outputs: (out) => session.outputNames.map((n) => ({data: out[n].data, dtype: out[n].type, dims: out[n].dims})),
    names: () => session.outputNames,
    release: () => session.release(),
  };
}

// LiteRT.js (@litertjs/core, ESM, loaded on the first .tflite job): its WASM CPU path; the threaded build
// when the page has more than one thread. Tensors take Float32Array, Int32Array and Uint8Array only (an
// int8-I/O file is refused at compile, with LiteRT.js's own message).
let LITERT = null;
const LITERT_ARRAYS = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array};

async function litertRunner(job) {
  if (!LITERT) {
    const mod = await import("/litert/dist/index.js");
    await mod.loadLiteRt("/litert/wasm/", THREADS > 1 ? {threads: true} : {});
    LITERT = mod;
  }
  const model = await LITERT.loadAndCompile(new Uint8Array(await fetchBytes(job.model_url)),
    {accelerator: "wasm", cpuOptions: {numThreads: THREADS}});
  const keys = job.output_keys;  // the signature's output names, in the host's output order
  const drop = (o) => { for (const t of Object.values(o)) t.delete(); };  // tensors live in the WASM heap until deleted
  return {
    async feeds(specs) {
      const out = {};
      for (const s of specs) {
        const Arr = LITERT_ARRAYS[s.dtype];
        if (!Arr) throw new Error(`input ${s.name}: dtype ${s.dtype} has no LiteRT.js tensor type (float32, int32, uint8)`);
        out[s.key] = new LITERT.Tensor(new Arr(await fetchBytes(s.url)), s.shape);
      }
      return out;
    },
    run: (x) => model.run(x),
    free: drop,
    outputs(out) {
      const r = keys.map((k) => {
        const t = out[k];
        if (!t) throw new Error(`LiteRT.js returned no output ${k} (it has ${Object.keys(out)})`);
        return {data: t.toTypedArray(), dtype: t.type.dtype, dims: Array.from(t.type.layout.dimensions)};
      });
      drop(out);
      return r;
    },
    names: () => keys,
    release: () => model.delete(),
  };
}

const RUNNERS = {onnxruntime: ortRunner, litert: litertRunner};

async function memory() {
  const m = {};
  if (performance.memory) {  // Chromium's (precise with --enable-precise-memory-info)
    m.js_heap_used_mb = performance.memory.usedJSHeapSize / 1048576;
    m.js_heap_total_mb = performance.memory.totalJSHeapSize / 1048576;
  }
  if (self.crossOriginIsolated && performance.measureUserAgentSpecificMemory) {
    try {  // the page's whole memory, WASM linear memory included (eager with ForceEagerMeasureMemory)
      const r = await Promise.race([performance.measureUserAgentSpecificMemory(),
        new Promise((_, no) => setTimeout(() => no(new Error("timed out")), 10000))]);
      m.page_mb = r.bytes / 1048576;
    } catch (e) {
      m.page_reason = `measureUserAgentSpecificMemory failed: ${e.message}`;
    }
  } else {
    m.page_reason = "measureUserAgentSpecificMemory needs a cross-origin isolated page";
  }
  return m;
}

function failure(kind, err) {
  return {ok: false, kind: kind, message: (err && err.message) ? err.message : String(err)};
}

async function measure(job) {
  const load = RUNNERS[job.runtime];
  if (!load) return failure("runtime_missing", new Error(`this page has no runtime ${job.runtime}`));
  let rt;
  const t0 = performance.now();
  try {
    rt = await load(job);
  } catch (e) {
    return failure("model_load_failed", e);
  }
  const loadMs = performance.now() - t0;
  const res = timerResolutionMs();
  const answer = {ok: true, load_ms: loadMs, timer_resolution_ms: res};
  try {
    const x = await rt.feeds(job.timed_inputs);
    // a runtime whose outputs live until freed (LiteRT.js) frees each run's
    const once = async () => { const o = await rt.run(x); if (rt.free) rt.free(o); };
    for (let i = 0; i < job.warmup; i++) await once();
    // iterations per timed sample: one sample spans >= 200 timer ticks (and >= 1 ms)
    let a = performance.now();
    let k;
    if (job.min_sample_ms) {
      // a CPU-throttled page (DevTools pauses the thread in slices): a sample spans many slices, or a run
      // that fell between pauses reads at full speed; k = the runs that fit in one such window
      let n = 0;
      while (performance.now() - a < job.min_sample_ms) { await once(); n++; }
      k = Math.max(1, n);
    } else {
      await once();
      const one = Math.max(performance.now() - a, res);
      k = Math.max(1, Math.ceil(Math.max(1.0, 200 * res) / one));
    }
    const raw = [];
    const started = performance.now();
    for (;;) {
      a = performance.now();
      for (let i = 0; i < k; i++) await once();
      raw.push((performance.now() - a) / k);
      const el = (performance.now() - started) / 1000;
      if (raw.length * k >= job.max_runs || el >= job.max_seconds) break;
      if (raw.length >= job.runs && el >= job.min_seconds) break;
    }
    answer.raw = raw;
    answer.iterations_per_sample = k;
    answer.warmup = job.warmup;
    if (rt.free) rt.free(x);
  } catch (e) {
    return failure("inference_failed", e);
  }
  answer.memory = await memory();
  const te = performance.now();
  try {
    for (let b = 0; b < job.eval_batches.length; b++) {
      const x = await rt.feeds(job.eval_batches[b]);
      const outs = rt.outputs(await rt.run(x));
      if (rt.free) rt.free(x);
      for (let o = 0; o < outs.length; o++) {
        const r = await fetch(`${job.upload_url}/${b}/${o}`, {method: "POST", body: outs[o].data,
          headers: {"X-Dtype": outs[o].dtype, "X-Shape": JSON.stringify(outs[o].dims)}});
        if (!r.ok) throw new Error(`upload of output ${o} of batch ${b}: HTTP ${r.status}`);
      }
    }
  } catch (e) {
    return failure("inference_failed", e);
  }
  answer.eval_seconds = (performance.now() - te) / 1000;  // uploads included
  answer.output_names = rt.names();
  await rt.release();
  return answer;
}

async function post(url, doc) {
  await fetch(url, {method: "POST", body: JSON.stringify(doc), headers: {"Content-Type": "application/json"}});
}

async function main() {
  await post("/hello", {user_agent: navigator.userAgent, threads: THREADS, wasm_simd: SIMD, wasm_threads: WASM_THREADS,
    cross_origin_isolated: self.crossOriginIsolated === true, hardware_concurrency: navigator.hardwareConcurrency,
    ort_version: ort.env.versions ? ort.env.versions.web || ort.env.versions.common : null});
  for (;;) {
    const r = await fetch("/job");
    if (r.status === 204) continue;  // the host's long poll ended with nothing to do
    const job = await r.json();
    if (job.kind === "reload") {  // ONNX Runtime Web fixes its WASM thread pool once per page
      location.replace(`/agent.html?threads=${job.threads}`);
      return;
    }
    log(`job ${job.id}: ${job.variant}`);
    let doc;
    try {
      doc = await measure(job);
    } catch (e) {
      doc = failure("inference_failed", e);
    }
    await post(`/result/${job.id}`, doc);
  }
}

main().catch((e) => post("/hello", {fatal: String(e)}));
