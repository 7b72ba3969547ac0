"""Build Report objects directly (no deploy): synthetic but realistic right-skewed timings, drawn
from a fixed seed, so report tests are fast and deterministic."""

from __future__ import annotations

import numpy as np

from edgekit.inputs.recipe import GateConfig
from edgekit.measure.stats import latency_stats
from edgekit.report.gate import evaluate_gate
from edgekit.report.model import Report, VariantResult


def timings(median_ms: float, n: int = 400, seed: int = 0, spread: float = 0.08) -> list[float]:
    """Log-normal timings with a small tail of scheduler hiccups, like a busy CPU."""
    rng = np.random.default_rng(seed)
    x = median_ms * rng.lognormal(0.0, spread, n)
    hiccups = rng.random(n) < 0.02
    x[hiccups] *= rng.uniform(2, 6, hiccups.sum())
    return [float(v) for v in x]


def lineage(variant: str, hops=(("torch->onnx", 6e-6),), passes=()) -> list[dict]:
    steps = [{"kind": "source", "name": "torch.export", "config": {"path": "model.pt2"}, "metrics": {}}]
    for name, err in hops:
        steps.append({"kind": "convert", "name": name, "config": {"opset": 18}, "input_sha256": "a" * 64,
                      "metrics": {"parity": {"reference": "pytorch", "max_abs_err": err, "mean_abs_err": err / 5,
                                             "cosine": 1.0, "top1_agreement": 1.0, "n": 360},
                                  "parity_violations": []}})
    for p in passes:
        steps.append({"kind": "pass", "name": p, "config": {"mode": "static"}, "metrics": {}})
    return steps


def variant(name: str, *, median: float = 1.0, acc: float | None = 98.0, size: int = 200_000,
            mem: float | None = 60.0, precision: str = "fp32", seed: int = 0, n: int = 400, raw: bool = True,
            selected: bool = False, **extra) -> VariantResult:
    t = timings(median, n=n, seed=seed)
    stats = latency_stats(t).to_dict()
    return VariantResult(
        name=name, format="onnx", precision=precision,
        runtime={"name": "onnxruntime", "version": "1.32.0", "threads": 1},
        size_bytes=size, sha256=(name.encode().hex() * 64)[:64],
        lineage=lineage(name, passes=() if precision == "fp32" else ("quantize",)),
        latency_ms={"warmup": 5, "runs": n, "raw": t if raw else None, **stats},
        peak_memory_mb=mem, energy_reason="no readable energy source (test)",
        accuracy=None if acc is None else {"metric": "top1", "value": acc, "n": 360},
        parity={"reference": "pytorch", "max_abs_err": 1e-5 if precision == "fp32" else 0.2, "mean_abs_err": 1e-6,
                "cosine": 0.9999, "top1_agreement": 1.0 if precision == "fp32" else 0.98, "n": 360},
        selected=selected, **extra,
    )


def report(variants: list[VariantResult], *, baseline: str = "fp32", cfg: GateConfig | None = None,
           created_at: str = "2026-11-30T00:00:00+00:00", device: str = "lab-pi") -> Report:
    base = next((v for v in variants if v.name == baseline), None)
    for v in variants:
        if base is not None and v.accuracy and base.accuracy:
            v.accuracy_drop = round(base.accuracy.value - v.accuracy.value, 4)
    cfg = cfg or GateConfig()
    return Report(
        edgekit_version="0.1.0", created_at=created_at, target="rpi4",
        device={"name": device, "arch": "aarch64", "cpu": "Cortex-A72", "cores": 4, "transport": "ssh",
                "governor": "ondemand", "temperature_c": {"before": 45.0, "after": 51.5}},
        model={"source": "model.pt2", "sha256": "c" * 64, "format": "torch"},
        settings={"gate": cfg.model_dump()}, baseline=baseline, variants=variants,
        gate=evaluate_gate(variants, baseline, cfg),
    )


def release_pair(*, slower: float = 1.0, acc_after: float = 98.0, size_after: int = 60_000, mem_after: float = 60.0,
                 raw: bool = True):
    """(last release, this run): fp32 + int8; this run's int8 is ``slower`` times the release's median."""
    old = report([variant("fp32", median=1.0, seed=1, raw=raw),
                  variant("int8", median=0.5, precision="int8", size=60_000, seed=2, raw=raw)],
                 created_at="2026-11-01T00:00:00+00:00")
    new = report([variant("fp32", median=1.0, seed=3, raw=raw),
                  variant("int8", median=0.5 * slower, precision="int8", size=size_after, acc=acc_after,
                          mem=mem_after, seed=4, raw=raw)])
    return old, new
