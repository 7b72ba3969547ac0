"""Language-model quality from the device's own outputs, computed on the host.

The float model scores the same teacher-forced windows on the host (``reference``). The device returns per
position the log-probability of the next token, its argmax, and its log-probabilities at the float model's
top-K token ids (``generation.score_windows`` in the agent). From these:

- **perplexity** ``exp(mean NLL)`` of the next tokens (exact: the target's log-probability is full-softmax);
- **KL divergence from the float model** ``KL(P_float || Q_device)`` per position over the float model's most
  likely tokens there plus one bucket for all other tokens: ``sum_k p_k log(p_k/q_k) + r_p log(r_p/r_q)``. It is
  exact when the tokens cover the vocabulary and a lower bound otherwise (merging outcomes never increases a KL
  divergence); the float model's tail mass ``r_p`` is reported so a reader sees how much the bound leaves out.
  **How many tokens a position**: by default as many as hold ``COVERAGE`` (99.5%) of the float model's mass
  there (a confident position needs a handful, a flat one thousands), so the bound is tight on any trained
  model; the ids travel ragged (``offsets``). ``MAX_SCORED_IDS`` caps what one variant moves (ids out, log-probs
  back, 4 bytes each): past it the flattest positions are cut to a common K and the report says how much mass
  was covered. ``--top-k K`` overrides with K tokens at every position;
- **top-1 agreement** of the device's argmax with the float model's.

Every drop carries a 95% bootstrap CI that resamples whole windows (positions inside a window are not
independent), seeded so a report is reproducible."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..report.gate import KLD_COVERAGE

BOOTSTRAP = 1000
SEED = 20261205
COVERAGE = KLD_COVERAGE  # the float model's mass a position's scored tokens hold by default (what the gate judges)
# ids a variant's scoring moves at most (4 bytes out, 4 back each: 2 x 16 MB); ~4000 positions (32 windows of
# 128 tokens) at 1000 tokens each. A trained model's confident positions need far fewer.
MAX_SCORED_IDS = 4_000_000


@dataclass(frozen=True)
class Reference:
    """The float model on the eval windows: what the device's outputs are compared with. The scored ids are
    ragged: position ``p`` (row-major over [W, T-1]) holds ``top_ids[offsets[p]:offsets[p+1]]``."""

    target_logprob: np.ndarray  # [W, T-1]
    argmax: np.ndarray  # [W, T-1]
    top_ids: np.ndarray  # [N] int32: each position's most likely tokens, most likely first
    top_logprob: np.ndarray  # [N] float32: the float model's log-probabilities there
    offsets: np.ndarray  # [W*(T-1)+1] int64
    coverage: float | None = COVERAGE  # the mass each position's tokens were sized to hold (None: a fixed K)
    capped_at: int | None = None  # the K the flattest positions were cut to (MAX_SCORED_IDS), None: not cut
    greedy: np.ndarray | None = None  # [P, N] the float model's greedy continuations of the prompts

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def k(self) -> int:
        """The most tokens a position scores."""
        return int(self.counts.max()) if self.counts.size else 0

    def describe(self) -> dict[str, Any]:
        """What the scoring covered and what it costs to move (the report's ``quality`` carries it)."""
        c = self.counts
        return {
            "top_k": self.k,
            "top_k_mean": float(c.mean()) if c.size else 0.0,
            "coverage_target": self.coverage,
            "top_k_capped_at": self.capped_at,
            "scored_ids": int(self.top_ids.size),
            # out: the ids (int32) and offsets (int64); back: one float32 log-probability an id
            "scoring_bytes": int(self.top_ids.size * 4 + self.offsets.size * 8 + self.top_ids.size * 4),
        }


def _log_softmax_windows(model: Any, windows: np.ndarray) -> Any:
    """Per window: (its index, the float model's log-probabilities [T-1, V] in float64)."""
    import torch

    with torch.no_grad():
        for i in range(windows.shape[0]):
            x = torch.as_tensor(windows[i : i + 1].astype(np.int64))
            yield i, x, torch.log_softmax(model(x).logits[0, :-1].double(), dim=-1)


def tokens_to_cover(sorted_lp: Any, coverage: float) -> np.ndarray:
    """Per row of descending log-probabilities: the fewest tokens whose probabilities sum to ``coverage``."""
    import torch

    cum = torch.cumsum(sorted_lp.exp(), dim=-1)
    k = (cum < coverage).sum(dim=-1) + 1
    out: np.ndarray = np.minimum(k.numpy(), sorted_lp.shape[-1]).astype(np.int64)
    return out


def cap_for(counts: np.ndarray, budget: int) -> int | None:
    """The largest K with ``sum(min(counts, K)) <= budget`` (None: no cut needed)."""
    if int(counts.sum()) <= budget:
        return None
    lo, hi = 1, int(counts.max())
    while lo < hi:  # the largest K that fits
        mid = (lo + hi + 1) // 2
        if int(np.minimum(counts, mid).sum()) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def reference(
    model: Any,
    windows: np.ndarray,
    k: int | None = None,
    coverage: float = COVERAGE,
    max_ids: int | None = None,
) -> Reference:
    """Score ``windows`` [W, T] with the float torch model (one forward a window, as the device does).

    ``k``: that many tokens at every position (``--top-k``); None: at each position the fewest that hold
    ``coverage`` of the float model's mass, the flattest positions cut to a common K if the whole would pass
    ``max_ids`` (default ``MAX_SCORED_IDS``). Sizing takes one forward pass over the windows and gathering a
    second one (the logits of every window at once would not fit a host's memory on a real vocabulary)."""
    import torch

    w, t = windows.shape
    vocab = int(model.config.vocab_size)
    tgt = np.zeros((w, t - 1), np.float32)
    arg = np.zeros((w, t - 1), np.int32)
    capped: int | None = None
    if k is not None:
        counts = np.full(w * (t - 1), min(int(k), vocab), np.int64)
    else:
        counts = np.zeros(w * (t - 1), np.int64)
        for i, _x, lp in _log_softmax_windows(model, windows):
            counts[i * (t - 1) : (i + 1) * (t - 1)] = tokens_to_cover(
                torch.sort(lp, dim=-1, descending=True).values, coverage
            )
        capped = cap_for(counts, MAX_SCORED_IDS if max_ids is None else max_ids)
        if capped is not None:
            counts = np.minimum(counts, capped)
    offsets = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.zeros(int(offsets[-1]), np.int32)
    lps = np.zeros(int(offsets[-1]), np.float32)
    kmax = int(counts.max()) if counts.size else 0
    for i, x, lp in _log_softmax_windows(model, windows):
        tgt[i] = lp[torch.arange(t - 1), x[0, 1:]].numpy()
        arg[i] = lp.argmax(dim=-1).numpy()
        top = torch.topk(lp, kmax, dim=-1)
        top_i, top_v = top.indices.numpy(), top.values.numpy()
        for j in range(t - 1):
            p = i * (t - 1) + j
            a, b = int(offsets[p]), int(offsets[p + 1])
            ids[a:b], lps[a:b] = top_i[j, : b - a], top_v[j, : b - a]
    return Reference(
        target_logprob=tgt,
        argmax=arg,
        top_ids=ids,
        top_logprob=lps,
        offsets=offsets,
        coverage=None if k is not None else coverage,
        capped_at=capped,
    )


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


def kl_per_position(ref_lp: np.ndarray, dev_lp: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(KL per position, the float model's tail mass) from flat log-probabilities at the same ragged ids."""
    p = np.exp(ref_lp.astype(np.float64))
    q = np.exp(dev_lp.astype(np.float64))
    starts = offsets[:-1]
    kl = np.add.reduceat(p * (ref_lp.astype(np.float64) - dev_lp.astype(np.float64)), starts)
    r_p = np.clip(1.0 - np.add.reduceat(p, starts), 0.0, 1.0)
    r_q = np.clip(1.0 - np.add.reduceat(q, starts), 1e-12, 1.0)
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
    kl, tail = kl_per_position(ref.top_logprob, np.asarray(dev["logprob_at"]).reshape(-1), ref.offsets)
    agree = (dev["argmax"] == ref.argmax).astype(np.float64)
    ppl_f, ppl_v = float(np.exp(nll_f.mean())), float(np.exp(nll_v.mean()))

    def ppl_rise(idx: np.ndarray) -> float:
        return float(np.exp(nll_v[idx].mean() - nll_f[idx].mean()) - 1.0)

    out: dict[str, Any] = {
        "positions": int(nll_f.size),
        "windows": int(w),
        **ref.describe(),
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
        "float_tail_mass_max": float(tail.max()),
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
