"""One measurement of one model: load (timed), warm up, the timed runs with the device's state and energy
around them, the other shape buckets, memory, the runtime's op profile when asked, and the eval pass whose
outputs go back as an .npz. ``measure_ab`` times two models of one interface in alternating blocks."""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from .device import BusyMeter, device_facts, device_state, state_warnings
from .evaluation import Batching, batching, bucket_groups, bucket_latency, eval_outputs
from .hashing import model_sha256
from .memory import memory_mb, pss_mb, runtime_arena
from .protocol import AGENT_VERSION, EXIT_BAD_REQUEST, EXIT_RUNTIME, PROTOCOL, AgentFailure, Doc
from .runners import runner_for
from .runners.base import Runner, no_op_profile
from .streams import StreamPlan, assemble, data_specs, stream_outputs, stream_plan, zero_state
from .tensors import Shard, load_eval, pad, prepare, synthetic_inputs
from .timing import decimate, measure_with_energy, warmup_runs


def sysfs_root(req: Doc) -> str:
    """Where the device's /sys and /proc are read (a test or a chroot writes its own tree)."""
    return str(req.get("sysfs_root") or (req.get("energy") or {}).get("sysfs_root") or "/")


def verify_model(path: str, digest: str | None, companions: dict[str, str] | None) -> None:
    """The model file set is the one the host sent (content-addressed delivery checks it again here)."""
    if digest:
        got = model_sha256(path, companions)
        if got != digest:
            raise AgentFailure(
                "integrity",
                f"model file {path} has sha256 {got[:12]}..., expected {digest[:12]}... (corrupted transfer)",
                EXIT_BAD_REQUEST,
            )


def runtime_doc(runner: Runner) -> Doc:
    return {
        "name": runner.name,
        "version": runner.version,
        "threads": runner.threads,
        "delegate": runner.delegate,
        **({"options": runner.options} if runner.options else {}),
    }


def write_outputs(path: str, named: dict[str, np.ndarray]) -> None:
    """The eval outputs as one .npz, written to a temp name and renamed (never a partial file)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".partial.npz"
    np.savez(tmp, **named)  # type: ignore[arg-type]
    os.replace(tmp, path)


def _eval_pass(
    runner: Runner,
    xs: list[Shard],
    groups: list[list[Shard]] | None,
    plan: StreamPlan | None,
    batch: Batching,
    in_specs: Sequence[Doc],
    out_specs: Sequence[Doc],
) -> dict[str, np.ndarray]:
    """Every output on the eval set, named as the host's ``load_outputs`` reads them."""
    if plan is not None and plan.stateful:
        return {f"output_{i}": o for i, o in enumerate(stream_outputs(runner, xs, in_specs, out_specs, plan))}
    if groups is not None:  # one set of outputs per shape bucket: they cannot be stacked
        return {
            f"bucket_{j}_output_{i}": o
            for j, g in enumerate(groups)
            for i, o in enumerate(eval_outputs(runner, g, in_specs, out_specs, batch.eval, batch.static, plan))
        }
    outs = eval_outputs(runner, xs, in_specs, out_specs, batch.eval, batch.static, plan)
    return {f"output_{i}": o for i, o in enumerate(outs)}


def measure(req: Doc) -> Doc:
    """The agent's answer to one measurement request (see the module's docstring)."""
    model = req["model"]
    verify_model(model, req.get("model_sha256"), req.get("companions"))
    cls = runner_for(req["runtime"])
    in_specs = req["inputs"]
    out_specs = req.get("outputs") or []
    root = sysfs_root(req)

    state_before = device_state(root)
    rss0, _, _ = memory_mb()
    t0 = time.perf_counter()
    runner = cls.open(model, req)
    load_ms = (time.perf_counter() - t0) * 1000.0
    rss1, _, _ = memory_mb()

    ev = req.get("eval")
    plan = stream_plan(req, in_specs, out_specs)  # constant and state inputs, or None
    batch = batching(runner, ev, plan)
    xs: list[Shard] | None = None
    groups, n = None, 0
    if ev:
        xs = load_eval(ev, data_specs(plan, in_specs))
        n = sum(len(sh[0]) for sh in xs)
        groups = bucket_groups(xs, ev.get("buckets"), plan)
        sample = [pad(np.asarray(x[0 : batch.timed]), batch.timed) for x in xs[0]]
    else:
        sample = synthetic_inputs(data_specs(plan, in_specs))
    # the timed runs: one chunk, with the constants and a zero state
    feeds = [prepare(x, s) for x, s in zip(assemble(plan, sample, zero_state(plan, in_specs)), in_specs)]

    def run_once() -> None:
        runner.run(feeds)

    try:
        warm = warmup_runs(run_once, req)
        busy = BusyMeter()
        raw, sustained, energy = measure_with_energy(run_once, req, root)
        other_cpu = busy.other_cpu_fraction()
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runner.name} failed to run the model: {exc}", EXIT_RUNTIME) from exc
    runs_done = len(raw)
    by_bucket = None
    if groups is not None:  # the other shapes: one chunk each, timed after the main runs (bucket 0's)
        try:
            by_bucket = bucket_latency(runner, groups, raw, batch, plan, in_specs, req)
        except Exception as exc:
            raise AgentFailure(
                "inference_failed", f"{runner.name} failed on the eval data's other sample shapes: {exc}", EXIT_RUNTIME
            ) from exc
    raw, decimation = decimate(raw, int(req.get("max_raw", 200000)))
    _, peak_mb, mem_source = memory_mb()
    pss = pss_mb()
    arena_mb, arena_reason = runtime_arena(runner)
    state_after = device_state(root)
    warnings = list(runner.warnings) + state_warnings(state_before, state_after, other_cpu)
    if warm.get("warmup_stable") is False:
        warnings.append(f"latency did not stabilize during {warm['warmup']} warmup runs")
    op_profile = None
    if req.get("profile"):  # after the timed runs and the device readings, so it never touches them
        try:
            op_profile = runner.profile(feeds, int(req["profile"].get("runs", 20)))
        except Exception as exc:  # a profiler that breaks is the answer's reason, not a failed run
            op_profile = no_op_profile(f"{runner.name}'s profiler failed: {type(exc).__name__}: {exc}")

    outputs_path = req.get("outputs_path")
    eval_s = None
    if xs is not None:
        t_eval = time.perf_counter()
        named = _eval_pass(runner, xs, groups, plan, batch, in_specs, out_specs)
        eval_s = time.perf_counter() - t_eval  # the eval pass alone: what a sharded fleet divides
        if outputs_path:
            write_outputs(outputs_path, named)

    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "variant": req.get("variant"),
        "device": device_facts(),
        "device_state": {"before": state_before, "after": state_after, "other_cpu_fraction": other_cpu},
        "runtime": runtime_doc(runner),
        "load_ms": load_ms,
        "latency_ms": dict(
            warm,
            runs=runs_done,
            raw=raw,
            raw_decimation=decimation,
            **({"buckets": by_bucket} if by_bucket is not None else {}),
        ),
        "sustained": sustained,
        "memory": {
            "peak_rss_mb": peak_mb,
            "source": mem_source,
            "rss_before_load_mb": rss0,
            "rss_after_load_mb": rss1,
            "load_delta_mb": (rss1 - rss0) if (rss0 is not None and rss1 is not None) else None,
            "pss_mb": pss,
            "arena_mb": arena_mb,
            "arena_reason": arena_reason,
        },
        "energy": energy,
        "warnings": warnings,
        "eval": {
            "samples": n,
            "batch_size": batch.eval,
            "static_batch": batch.static,
            "seconds": round(eval_s, 4) if eval_s is not None else None,
            **(
                {"stateful": True, "order": "one sample at a time, state carried"}
                if plan is not None and plan.stateful
                else {}
            ),
        }
        if xs is not None
        else None,
        "outputs_path": outputs_path if xs is not None else None,
        **({"op_profile": op_profile} if op_profile is not None else {}),
    }


def _synthetic_feeds(req: Doc) -> list[Any]:
    """One sample of synthetic inputs for ``req``'s model, prepared as its runner takes them (its
    constants and a zero state where the request streams)."""
    in_specs = req["inputs"]
    plan = stream_plan(req, in_specs, req.get("outputs") or [])
    sample = assemble(plan, synthetic_inputs(data_specs(plan, in_specs)), zero_state(plan, in_specs))
    return [prepare(x, s) for x, s in zip(sample, in_specs)]


def measure_ab(req: Doc) -> Doc:
    """Two models in ONE process, timed in alternating blocks (A B, B A, A B ...): the request's model
    is A, ``ab.model`` is B. Whatever the device does meanwhile (other load, clocks, heat) hits both
    sides of a block pair alike, so the host can judge their ratio. Each block runs for
    ``block_seconds`` (at least ``min_runs`` runs, at most ``max_runs``). B may be another format on
    another runtime (the search's finals compare an ONNX Runtime file with a LiteRT one): ``ab``
    then carries B's ``runtime``, ``format``, ``inputs`` and ``outputs``, and each side is fed
    synthetic inputs of its own interface."""
    ab = req["ab"]
    # B's own files beside its model, and the runtime options its file needs (NCNN's fp16 setting)
    req_b = {
        **req,
        **{k: ab[k] for k in ("runtime", "format", "inputs", "outputs") if k in ab},
        "companions": ab.get("companions"),
        "runtime_options": ab["runtime_options"] if "runtime_options" in ab else req.get("runtime_options"),
    }
    for doc, path, digest in (
        (req, req["model"], req.get("model_sha256")),
        (req_b, ab["model"], ab.get("model_sha256")),
    ):
        if digest and model_sha256(path, doc.get("companions")) != digest:
            raise AgentFailure(
                "integrity", f"model file {path} does not have sha256 {digest[:12]}...", EXIT_BAD_REQUEST
            )
    classes = {"a": runner_for(req["runtime"]), "b": runner_for(req_b["runtime"])}
    runners = {"a": classes["a"].open(req["model"], req), "b": classes["b"].open(ab["model"], req_b)}
    feeds = {"a": _synthetic_feeds(req), "b": _synthetic_feeds(req_b)}
    try:
        for side, r in runners.items():
            warmup_runs(lambda r=r, f=feeds[side]: r.run(f), req)  # type: ignore[misc]
        blocks, block_s = int(ab.get("blocks", 20)), float(ab.get("block_seconds", 0.1))
        min_runs, max_runs = int(ab.get("min_runs", 3)), int(ab.get("max_runs", 500))
        clock = time.perf_counter_ns
        out: dict[str, list[list[float]]] = {"a": [], "b": []}
        order = []
        for i in range(blocks):
            for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
                run, fed, start = runners[side].run, feeds[side], time.perf_counter()
                t: list[float] = []
                while len(t) < max_runs and (len(t) < min_runs or time.perf_counter() - start < block_s):
                    a = clock()
                    run(fed)
                    t.append((clock() - a) / 1e6)
                out[side].append(t)
                order.append(side)
    except AgentFailure:
        raise
    except Exception as exc:
        names = " or ".join(dict.fromkeys(c.name for c in classes.values()))
        raise AgentFailure("inference_failed", f"{names} failed to run the model: {exc}", EXIT_RUNTIME) from exc
    raw_b = [x for blk in out["b"] for x in blk]
    # each side's runner notes (a delegate that could not prepare and fell back): a ratio between two
    # different kernel paths must say so
    warnings = [f"{side.upper()}: {w}" for side in ("a", "b") for w in runners[side].warnings]
    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "variant": req.get("variant"),
        "device": device_facts(),
        "load_ms": None,
        "warnings": warnings,
        "runtime": runtime_doc(runners["b"]),
        "latency_ms": {"warmup": int(req.get("warmup", 10)), "runs": len(raw_b), "raw": raw_b},
        "ab": {"a": out["a"], "b": out["b"], "order": "".join(order)},
    }
