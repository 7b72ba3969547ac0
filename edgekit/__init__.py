"""edgekit: take a trained PyTorch model to edge hardware and prove, on that hardware, that the
compressed model is still good enough to ship.

    import edgekit
    report = edgekit.deploy("model.pt2", target="local", eval_data="eval.npz", calib_data="calib.npz")
    if not report.gate.passed: ...

    # a language model (a transformers folder or a .gguf): generation measured on the device, the same entry
    report = edgekit.deploy("my-llama/", eval_text="eval.txt", target="local")

Heavy frameworks are imported lazily: ``import edgekit`` imports neither torch nor TensorFlow.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .version import __version__

_EXPORTS = {
    "deploy": "edgekit.pipeline.deploy:deploy",
    "profile": "edgekit.pipeline.deploy:profile",
    "DeployOptions": "edgekit.pipeline.deploy:DeployOptions",
    "search": "edgekit.variant_search.run:search",
    "SearchOptions": "edgekit.variant_search.run:SearchOptions",
    "Report": "edgekit.report.model:Report",
    "Artifact": "edgekit.artifact:Artifact",
    "TargetSpec": "edgekit.inputs.targets:TargetSpec",
    "load_target": "edgekit.inputs.targets:load_target",
    "list_targets": "edgekit.inputs.targets:list_targets",
    "Recipe": "edgekit.inputs.recipe:Recipe",
    "load_recipe": "edgekit.inputs.recipe:load_recipe",
    "EdgekitError": "edgekit.errors:EdgekitError",
    "BadInputError": "edgekit.errors:BadInputError",
    "ModelLoadError": "edgekit.errors:ModelLoadError",
    "DataError": "edgekit.errors:DataError",
    "TargetError": "edgekit.errors:TargetError",
    "ConfigError": "edgekit.errors:ConfigError",
    "OutputError": "edgekit.errors:OutputError",
    "MissingExtraError": "edgekit.errors:MissingExtraError",
    "ConversionError": "edgekit.errors:ConversionError",
    "PassError": "edgekit.errors:PassError",
    "GateFailed": "edgekit.errors:GateFailed",
    "DeviceError": "edgekit.errors:DeviceError",
    "TransportError": "edgekit.errors:TransportError",
    "AgentError": "edgekit.errors:AgentError",
    "AgentRunFailed": "edgekit.agent.protocol:AgentRunFailed",
    "DeviceLockedError": "edgekit.devices.lock:DeviceLockedError",
    "BudgetExceeded": "edgekit.timeline:BudgetExceeded",
    "train": "edgekit.train:train",
    "deploy_lm": "edgekit.orchestration.generate:deploy_lm",
    "LMOptions": "edgekit.llm.options:LMOptions",
    "LMGate": "edgekit.llm.judge:LMGate",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # pragma: no cover  (explicit re-exports, so type checkers see the public API)
    from .agent.protocol import AgentRunFailed as AgentRunFailed
    from .artifact import Artifact as Artifact
    from .devices.lock import DeviceLockedError as DeviceLockedError
    from .errors import AgentError as AgentError
    from .errors import BadInputError as BadInputError
    from .errors import ConfigError as ConfigError
    from .errors import ConversionError as ConversionError
    from .errors import DataError as DataError
    from .errors import DeviceError as DeviceError
    from .errors import EdgekitError as EdgekitError
    from .errors import GateFailed as GateFailed
    from .errors import MissingExtraError as MissingExtraError
    from .errors import ModelLoadError as ModelLoadError
    from .errors import OutputError as OutputError
    from .errors import PassError as PassError
    from .errors import TargetError as TargetError
    from .errors import TransportError as TransportError
    from .inputs.recipe import Recipe as Recipe
    from .inputs.recipe import load_recipe as load_recipe
    from .inputs.targets import TargetSpec as TargetSpec
    from .inputs.targets import list_targets as list_targets
    from .inputs.targets import load_target as load_target
    from .llm.judge import LMGate as LMGate
    from .llm.options import LMOptions as LMOptions
    from .orchestration.generate import deploy_lm as deploy_lm
    from .pipeline.deploy import DeployOptions as DeployOptions
    from .pipeline.deploy import deploy as deploy
    from .pipeline.deploy import profile as profile
    from .report.model import Report as Report
    from .timeline import BudgetExceeded as BudgetExceeded
    from .train import train as train
    from .variant_search.run import SearchOptions as SearchOptions
    from .variant_search.run import search as search


def __getattr__(name: str) -> Any:
    try:
        mod, attr = _EXPORTS[name].split(":")
    except KeyError:
        raise AttributeError(f"module 'edgekit' has no attribute {name!r}") from None
    return getattr(import_module(mod), attr)


def __dir__() -> list[str]:
    return sorted(__all__)
