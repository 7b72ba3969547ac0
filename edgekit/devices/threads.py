"""How many threads are worth tuning on a device: the one cap every kind of model's thread tuning reads
(the search's runtime settings, ``variant_search/tuning.py``, and a language model's file at other thread
counts, ``llm/threads.py``)."""

from __future__ import annotations

from typing import Any

# threads tuned at most: on 2-8 core boards the fourth thread rarely pays and each count costs a measurement
MAX_THREADS = 4


def thread_counts(limit: int, fixed: int | None = None) -> list[int]:
    """The thread counts every kind of model's tuning measures: 1, 2, 4 ... below ``limit``, and ``limit``
    itself (a 3-core budget tries 1, 2, 3; a 4-core one 1, 2, 4: the odd count between two powers of two
    rarely wins and each costs a measurement); only ``fixed`` when the user fixed ``--threads``."""
    if fixed:
        return [fixed]
    limit = max(1, limit)
    return sorted({t for t in (1, 2, 4) if t <= limit} | {limit})


def thread_limit(doc: dict[str, Any] | None, target_cores: int) -> tuple[int, str | None]:
    """The most threads worth tuning: the target's cores (at most MAX_THREADS), capped by the cores
    the agent reports usable in a result document (``device.cpu_budget.usable_cores``: affinity and
    cgroup quota, floored, at least 1; an older agent reports none: the target's cores). Returns the
    limit and, when the device capped it, why (for the report)."""
    limit = max(1, min(target_cores, MAX_THREADS))
    budget = ((doc or {}).get("device") or {}).get("cpu_budget") or {}
    usable = budget.get("usable_cores")
    if not isinstance(usable, (int, float)):
        return limit, None
    cap = max(1, int(usable + 1e-9))
    if cap >= limit:
        return limit, None
    quota, affinity = budget.get("quota_cores"), budget.get("affinity")
    why = "cgroup quota" if quota is not None and (affinity is None or quota < affinity) else "CPU affinity"
    amount = f"{usable:g} of a core" if usable < 1 else f"{usable:g} core{'' if usable == 1 else 's'}"
    return cap, (f"threads tuned 1..{cap}: the device has {amount} usable ({why}), the target {target_cores}")
