"""Teacher training with torch DistributedDataParallel, launched by torchrun, and the scale advisor
(``edgekit.train.plan``) that says when not to distribute.

    import edgekit
    result = edgekit.train("examples/digits/model.py:DigitsCNN", data="train.npz", out="teacher.pt2",
                           epochs=5, nproc_per_node=2)
    result.out, result.metrics["eval_accuracy"]

Importing this package imports neither torch nor polars.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .launch import TrainResult


def train(factory: str, data: str | Path, out: str | Path, *, epochs: int = 1, force: bool = False,
          progress: Optional[Callable[[str], None]] = None, **options: Any) -> "TrainResult":
    """Train ``factory``'s model on ``data`` with torchrun and write the ``.pt2`` teacher to ``out``.

    ``options`` are the fields of :class:`edgekit.train.config.TrainConfig` (batch_size, lr, seed,
    nproc_per_node, nnodes, node_rank, rdzv_endpoint, resume, ...). Returns a ``TrainResult``; the
    metrics are also in ``OUT.lineage.json``. Raises an ``EdgekitError`` (bad input: exit 2; a failed
    process or rendezvous: exit 3)."""
    from .config import TrainConfig
    from .launch import run

    from pydantic import ValidationError

    from ..errors import ConfigError

    try:
        cfg = TrainConfig(factory=factory, data=Path(data), out=Path(out), epochs=epochs, **options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "options"
        raise ConfigError(f"training option {where!r}: {first['msg']} (got {first.get('input')!r})",
                          hint="see `edgekit train --help` for the allowed values") from exc
    return run(cfg, echo=progress, force=force)


class _CallableModule(types.ModuleType):
    # `edgekit.train` is both this package and the API function: once the package is imported it
    # shadows the lazy export, so the package itself calls through to train().
    def __call__(self, *args: Any, **kwargs: Any) -> "TrainResult":
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["train"]
