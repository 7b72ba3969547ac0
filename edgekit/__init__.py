"""edgekit: take a trained PyTorch model to edge hardware and prove, on that hardware, that the
compressed model is still good enough to ship.

    import edgekit
    report = edgekit.deploy("model.pt2", target="local", eval_data="eval.npz", calib_data="calib.npz")
    if not report.gate.passed: ...

    # a language model (a transformers folder or a .gguf): generation measured on the device
    report = edgekit.deploy_lm("my-llama/", eval_text="eval.txt", target="local")

Heavy frameworks are imported lazily: ``import edgekit`` imports neither torch nor TensorFlow.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "deploy": "edgekit.pipeline:deploy",
    "profile": "edgekit.pipeline:profile",
    "DeployOptions": "edgekit.pipeline:DeployOptions",
    "search": "edgekit.variant_search.run:search",
    "SearchOptions": "edgekit.variant_search.run:SearchOptions",
    "Report": "edgekit.report.model:Report",
    "Artifact": "edgekit.artifact:Artifact",
    "TargetSpec": "edgekit.targets:TargetSpec",
    "load_target": "edgekit.targets:load_target",
    "list_targets": "edgekit.targets:list_targets",
    "Recipe": "edgekit.recipe:Recipe",
    "load_recipe": "edgekit.recipe:load_recipe",
    "EdgekitError": "edgekit.errors:EdgekitError",
    "train": "edgekit.train:train",
    "deploy_lm": "edgekit.llm.deploy:deploy_lm",
    "LMOptions": "edgekit.llm.deploy:LMOptions",
    "LMGate": "edgekit.llm.judge:LMGate",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # pragma: no cover
    from .artifact import Artifact  # noqa: F401
    from .pipeline import DeployOptions, deploy, profile  # noqa: F401
    from .errors import EdgekitError  # noqa: F401
    from .train import train  # noqa: F401
    from .recipe import Recipe, load_recipe  # noqa: F401
    from .report.model import Report  # noqa: F401
    from .targets import TargetSpec, list_targets, load_target  # noqa: F401
    from .llm.deploy import LMOptions, deploy_lm  # noqa: F401
    from .llm.judge import LMGate  # noqa: F401


def __getattr__(name: str) -> Any:
    try:
        mod, attr = _EXPORTS[name].split(":")
    except KeyError:
        raise AttributeError(f"module 'edgekit' has no attribute {name!r}") from None
    return getattr(import_module(mod), attr)


def __dir__() -> list[str]:
    return sorted(__all__)
