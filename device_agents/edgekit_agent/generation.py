"""The generation workload: a language model with a KV cache, measured as its users wait for it.

The request's ``generate`` section says what to run (the host builds it: ``edgekit/llm/request.py``):

- load (timed: the cold load) and the **cold first prefill** right after it (time to first token, cold);
- **prefill** at each of ``prompt_lengths`` (``prefill_repeats`` timed runs each, from an empty cache);
- **decode from an empty cache**: one token at a time, greedily, through the warm-up and the timed steps
  of the timing loop (``timing.py``: ``runs`` / ``min_seconds``, a sustained run, the energy windows; a
  step at the end of the context starts a new sequence), so ``latency_ms.raw`` holds one time per token;
- **decode from a filled cache**: ``decode_tokens`` steps after a prompt of ``filled_at`` tokens;
- **scoring** (``score``): teacher-forced windows of the eval text, one forward each; per position the
  log-probability of the next token, the argmax, and the log-probabilities of the token ids the host asks
  for (the float model's top-K there): what the host needs for perplexity, KL divergence and top-1
  agreement without pulling full logits off the device;
- **greedy generations** (``greedy``) from the host's prompts, compared on the host with the float model's.

Every figure is raw: per-run and per-token times, arrays. The host computes the statistics."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from .device import BusyMeter, device_facts, device_state, state_warnings
from .measure import runtime_doc, sysfs_root, verify_model, write_outputs
from .memory import memory_mb, pss_mb
from .protocol import AGENT_VERSION, EXIT_BAD_REQUEST, EXIT_RUNTIME, PROTOCOL, AgentFailure, Doc
from .runners import decoder_for
from .runners.decoder import Decoder
from .timing import decimate, measure_with_energy, warmup_runs

#: what output_K holds (scoring first, then the greedy generations when asked)
OUTPUT_NAMES = ("target_logprob", "argmax", "logprob_at", "greedy")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return np.asarray(x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))), dtype=np.float32)


def _timed(fn: Any) -> float:
    a = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - a) / 1e6


def _prompt(g: Doc, n: int) -> list[int]:
    ids = list(g["prompt_ids"])
    if n > len(ids):
        raise AgentFailure(
            "bad_request", f"a prompt of {n} tokens asked for, the request carries {len(ids)}", EXIT_BAD_REQUEST
        )
    return ids[:n]


class Stepper:
    """Greedy decoding one token a call, from an empty cache; at the end of the context it begins anew (so a
    long timed or sustained run never overflows a static cache)."""

    def __init__(self, dec: Decoder, first: int, limit: int) -> None:
        self.dec, self.first, self.limit = dec, first, limit
        self.pos, self.token = 0, first

    def __call__(self) -> None:
        if self.pos >= self.limit:
            self.pos, self.token = 0, self.first
        logits = self.dec.forward([self.token], self.pos)
        self.token = int(np.argmax(logits[-1]))
        self.pos += 1


def score_windows(
    dec: Decoder, windows: np.ndarray, ids: np.ndarray | None, offsets: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Teacher-forced scoring: per window one forward from an empty cache; position t predicts token t+1.
    ``ids`` [W, T-1, K], or flat [N] with ``offsets`` [W*(T-1)+1] (position p's ids are
    ``ids[offsets[p]:offsets[p+1]]``, so a confident position asks for few tokens and a flat one for many)."""
    w, t = windows.shape
    target = np.zeros((w, t - 1), np.float32)
    argmax = np.zeros((w, t - 1), np.int32)
    if ids is None:
        at = np.zeros((w, t - 1, 0), np.float32)
    elif offsets is None:
        at = np.zeros((w, t - 1, ids.shape[-1]), np.float32)
    else:
        at = np.zeros(ids.shape[0], np.float32)
    for i in range(w):
        lp = log_softmax(dec.forward([int(v) for v in windows[i]], 0)[:-1])
        target[i] = lp[np.arange(t - 1), windows[i, 1:]]
        argmax[i] = lp.argmax(axis=-1)
        if ids is not None and offsets is None:
            at[i] = np.take_along_axis(lp, ids[i].astype(np.int64), axis=-1)
        elif ids is not None and offsets is not None:
            seg = offsets[i * (t - 1) : (i + 1) * (t - 1) + 1]
            rows = np.repeat(np.arange(t - 1), np.diff(seg))
            at[seg[0] : seg[-1]] = lp[rows, ids[seg[0] : seg[-1]].astype(np.int64)]
    return {"target_logprob": target, "argmax": argmax, "logprob_at": at}


def greedy(dec: Decoder, prompts: Sequence[Sequence[int]], new_tokens: int) -> np.ndarray:
    out = np.zeros((len(prompts), new_tokens), np.int32)
    for i, p in enumerate(prompts):
        tok = int(np.argmax(dec.forward([int(v) for v in p], 0)[-1]))
        for j in range(new_tokens):
            out[i, j] = tok
            if j + 1 < new_tokens:
                tok = int(np.argmax(dec.forward([tok], len(p) + j)[-1]))
    return out


def _load_scoring(g: Doc) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    sc = g["score"]
    try:
        windows = np.load(sc["windows"], allow_pickle=False)
        ids = np.load(sc["ids"], allow_pickle=False) if sc.get("ids") else None
        offsets = np.load(sc["offsets"], allow_pickle=False) if sc.get("offsets") else None
    except (OSError, ValueError) as exc:
        raise AgentFailure("bad_data", f"cannot read the scoring windows: {exc}", EXIT_BAD_REQUEST) from exc
    positions = windows.shape[0] * (windows.shape[1] - 1) if windows.ndim == 2 else -1
    if offsets is not None:
        fits = (
            ids is not None
            and ids.ndim == 1
            and offsets.shape == (positions + 1,)
            and int(offsets[0]) == 0
            and int(offsets[-1]) == ids.shape[0]
            and bool((np.diff(offsets) >= 0).all())
        )
    else:
        fits = ids is None or ids.shape[:2] == (windows.shape[0], windows.shape[1] - 1)
    if windows.ndim != 2 or windows.shape[1] < 2 or not fits:
        raise AgentFailure(
            "bad_data",
            f"scoring windows {windows.shape} / ids {None if ids is None else ids.shape} / offsets "
            f"{None if offsets is None else offsets.shape} do not fit: windows [W, T], and ids [W, T-1, K] or "
            "ids [N] with offsets [W*(T-1)+1] running from 0 to N",
            EXIT_BAD_REQUEST,
        )
    return windows, ids, offsets


def generate(req: Doc) -> Doc:
    """The agent's answer to a generation request (see the module's docstring)."""
    g = req["generate"]
    verify_model(req["model"], req.get("model_sha256"), req.get("companions"))
    cls = decoder_for(req["runtime"])
    root = sysfs_root(req)
    state_before = device_state(root)
    rss0, _, _ = memory_mb()
    t0 = time.perf_counter()
    dec: Decoder = cls.open(req["model"], req)  # type: ignore[assignment]
    load_ms = (time.perf_counter() - t0) * 1000.0
    rss1, _, _ = memory_mb()
    context = int(g["context"])
    try:
        first_len = int(g["prompt_lengths"][0])
        ttft_cold = _timed(lambda: dec.forward(_prompt(g, first_len), 0))
        prefill = []
        for n in g["prompt_lengths"]:
            ids = _prompt(g, int(n))
            dec.forward(ids, 0)  # untimed: the first run at a new length allocates
            prefill.append(
                {
                    "tokens": int(n),
                    "ms": [
                        _timed(lambda ids=ids: dec.forward(ids, 0)) for _ in range(int(g.get("prefill_repeats", 5)))
                    ],
                }
            )
        step = Stepper(dec, int(g["prompt_ids"][0]), context)
        warm = warmup_runs(step, req)
        busy = BusyMeter()
        step.pos = context  # the timed steps begin a fresh sequence
        raw, sustained, energy = measure_with_energy(step, req, root)
        other_cpu = busy.other_cpu_fraction()
        filled_at = int(g["filled_at"])
        n_dec = int(g["decode_tokens"])
        tok = int(np.argmax(dec.forward(_prompt(g, filled_at), 0)[-1]))
        filled = []
        for j in range(n_dec):
            a = time.perf_counter_ns()
            tok = int(np.argmax(dec.forward([tok], filled_at + j)[-1]))
            filled.append((time.perf_counter_ns() - a) / 1e6)
        kv_bytes = dec.kv_cache_bytes()  # the cache at its fullest in this run (filled_at + decode_tokens)
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure(
            "inference_failed", f"{dec.name} failed to generate: {type(exc).__name__}: {exc}", EXIT_RUNTIME
        ) from exc
    _, peak_mb, mem_source = memory_mb()
    state_after = device_state(root)

    named: dict[str, np.ndarray] = {}
    eval_doc = None
    try:
        if g.get("score"):
            windows, top_ids, offsets = _load_scoring(g)
            t_eval = time.perf_counter()
            named.update(score_windows(dec, windows, top_ids, offsets))
            eval_doc = {
                "windows": int(windows.shape[0]),
                "tokens": int(windows.shape[1]),
                "seconds": round(time.perf_counter() - t_eval, 4),
            }
        if g.get("greedy"):
            named["greedy"] = greedy(dec, g["greedy"]["prompts"], int(g["greedy"]["new_tokens"]))
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure(
            "inference_failed", f"{dec.name} failed on the eval text: {type(exc).__name__}: {exc}", EXIT_RUNTIME
        ) from exc
    outputs_path = req.get("outputs_path")
    present = [k for k in OUTPUT_NAMES if k in named]  # output_K is present[K] (the answer's "outputs")
    if named and outputs_path:
        write_outputs(outputs_path, {f"output_{i}": named[k] for i, k in enumerate(present)})

    raw, decimation = decimate(raw, int(req.get("max_raw", 200000)))
    warnings = list(dec.warnings) + state_warnings(state_before, state_after, other_cpu)
    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "variant": req.get("variant"),
        "device": device_facts(),
        "device_state": {"before": state_before, "after": state_after, "other_cpu_fraction": other_cpu},
        "runtime": runtime_doc(dec),
        "load_ms": load_ms,
        # one time per generated token (decode from an empty cache): the inter-token latency
        "latency_ms": dict(warm, runs=len(raw), raw=raw, raw_decimation=decimation),
        "sustained": sustained,
        "memory": {
            "peak_rss_mb": peak_mb,
            "source": mem_source,
            "rss_before_load_mb": rss0,
            "rss_after_load_mb": rss1,
            "load_delta_mb": (rss1 - rss0) if (rss0 is not None and rss1 is not None) else None,
            "pss_mb": pss_mb(),
            "kv_cache_mb": kv_bytes / 2**20 if kv_bytes is not None else None,
            "kv_cache_tokens": filled_at + n_dec,
            "kv_cache_source": dec.kv_source,
        },
        "energy": energy,  # per "inference" = per generated token
        "warnings": warnings,
        "generation": {
            "context": context,
            "ttft_cold_ms": ttft_cold,
            "prefill": prefill,
            "decode_filled": {"start": filled_at, "ms": filled},
        },
        "eval": eval_doc,
        "outputs": present,
        "outputs_path": outputs_path if named else None,
    }
