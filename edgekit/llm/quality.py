"""Language-model quality from the device's own outputs, computed on the host.

The float model scores the same teacher-forced windows on the host (``reference``). The device returns per
position the log-probability of the next token, its argmax, and its log-probabilities at the float model's
top-K token ids (``generation.score_windows`` in the agent). From these:

- **perplexity** ``exp(mean NLL)`` of the next tokens (exact: the target's log-probability is full-softmax);
- **KL divergence from the float model** ``KL(P_float || Q_device)`` per position over the float model's top-K
  tokens plus one bucket for all other tokens: ``sum_k p_k log(p_k/q_k) + r_p log(r_p/r_q)``. It is exact when
  K covers the vocabulary and a lower bound otherwise (merging outcomes never increases a KL divergence);
  the float model's tail mass ``r_p`` is reported so a reader sees how much the bound leaves out. K=256 moves
  about 1 KB a position off the device instead of the full vocabulary (128 KB a position at 32k tokens);
- **top-1 agreement** of the device's argmax with the float model's.

Every drop carries a 95% bootstrap CI that resamples whole windows (positions inside a window are not
independent), seeded so a report is reproducible."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

BOOTSTRAP = 1000
SEED = 20261205


@dataclass(frozen=True)
class Reference:
    """The float model on the eval windows: what the device's outputs are compared with."""

    target_logprob: np.ndarray  # [W, T-1]
    argmax: np.ndarray  # [W, T-1]
    top_ids: np.ndarray  # [W, T-1, K] int32: the float model's K most likely tokens a position
    top_logprob: np.ndarray  # [W, T-1, K]
    greedy: np.ndarray | None = None  # [P, N] the float model's greedy continuations of the prompts

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[-1])


def reference(model: Any, windows: np.ndarray, k: int) -> Reference:
    """Score ``windows`` [W, T] with the float torch model (one forward a window, as the device does)."""
    import torch

    w, t = windows.shape
    k = min(k, int(model.config.vocab_size))
    tgt = np.zeros((w, t - 1), np.float32)
    arg = np.zeros((w, t - 1), np.int32)
    ids = np.zeros((w, t - 1, k), np.int32)
    lps = np.zeros((w, t - 1, k), np.float32)
    with torch.no_grad():
        for i in range(w):
            x = torch.as_tensor(windows[i : i + 1].astype(np.int64))
            lp = torch.log_softmax(model(x).logits[0, :-1].double(), dim=-1)
            tgt[i] = lp[torch.arange(t - 1), x[0, 1:]].numpy()
            arg[i] = lp.argmax(dim=-1).numpy()
            top = torch.topk(lp, k, dim=-1)
            ids[i], lps[i] = top.indices.numpy(), top.values.numpy()
    return Reference(target_logprob=tgt, argmax=arg, top_ids=ids, top_logprob=lps)


def greedy_reference(model: Any, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
    """The float model's greedy continuation of each prompt (no sampling: the device decodes greedily too)."""
    import torch

    out = np.zeros((len(prompts), new_tokens), np.int32)
    with torch.no_grad():
        for i, p in enumerate(prompts):  # plain argmax, end-of-text included, as the device decodes
            seq = list(p)
            for j in range(new_tokens):
                out[i, j] = int(model(torch.as_tensor([seq])).logits[0, -1].argmax())
                seq.append(int(out[i, j]))
    return out


def kl_per_position(ref_lp: np.ndarray, dev_lp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(KL per position, the float model's tail mass) from log-probabilities at the same top-K ids."""
    p = np.exp(ref_lp.astype(np.float64))
    q = np.exp(dev_lp.astype(np.float64))
    kl = (p * (ref_lp.astype(np.float64) - dev_lp.astype(np.float64))).sum(axis=-1)
    r_p = np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)
    r_q = np.clip(1.0 - q.sum(axis=-1), 1e-12, 1.0)
    tail = np.where(r_p > 1e-9, r_p * (np.log(np.maximum(r_p, 1e-300)) - np.log(r_q)), 0.0)
    return np.maximum(kl + tail, 0.0), r_p


def _boot(stat_fn: Any, w: int, seed: int = SEED) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    vals = [stat_fn(rng.integers(0, w, size=w)) for _ in range(BOOTSTRAP)]
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def first_divergence(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first position where two token sequences differ (None: identical)."""
    diff = np.nonzero(np.asarray(a) != np.asarray(b))[0]
    return int(diff[0]) if diff.size else None


def degenerate(tokens: np.ndarray) -> float:
    """The largest share of one token in a generated sequence (1.0: it repeats one token throughout)."""
    t = np.asarray(tokens).ravel()
    if t.size == 0:
        return 0.0
    return float(np.bincount(t.astype(np.int64)).max() / t.size)


def quality(ref: Reference, dev: dict[str, np.ndarray]) -> dict[str, Any]:
    """The variant's quality against the float model (see the module's docstring); every figure in the report."""
    w = ref.target_logprob.shape[0]
    nll_f, nll_v = -ref.target_logprob.astype(np.float64), -dev["target_logprob"].astype(np.float64)
    kl, tail = kl_per_position(ref.top_logprob, dev["logprob_at"])
    agree = (dev["argmax"] == ref.argmax).astype(np.float64)
    ppl_f, ppl_v = float(np.exp(nll_f.mean())), float(np.exp(nll_v.mean()))

    def ppl_rise(idx: np.ndarray) -> float:
        return float(np.exp(nll_v[idx].mean() - nll_f[idx].mean()) - 1.0)

    out: dict[str, Any] = {
        "positions": int(nll_f.size),
        "windows": int(w),
        "top_k": ref.k,
        "perplexity": ppl_v,
        "perplexity_float": ppl_f,
        "perplexity_increase": ppl_v / ppl_f - 1.0,
        "perplexity_increase_ci95": list(_boot(ppl_rise, w)),
        "kld_mean": float(kl.mean()),
        "kld_ci95": list(_boot(lambda i: float(kl[i].mean()), w)),
        "kld_p99": float(np.percentile(kl, 99)),
        "kld_max": float(kl.max()),
        "kld_bound": "exact" if float(tail.max()) < 1e-6 else "lower",
        "float_tail_mass_mean": float(tail.mean()),
        "top1_agreement": float(agree.mean()),
        "top1_agreement_ci95": list(_boot(lambda i: float(agree[i].mean()), w)),
    }
    if ref.greedy is not None and "greedy" in dev:
        div = [first_divergence(a, b) for a, b in zip(ref.greedy, dev["greedy"])]
        out["greedy"] = {
            "prompts": len(div),
            "new_tokens": int(ref.greedy.shape[1]),
            "first_divergence": div,
            "identical": sum(d is None for d in div),
            "repeat_share": max(degenerate(g) for g in dev["greedy"]),
            "repeat_share_float": max(degenerate(g) for g in ref.greedy),
        }
    return out
