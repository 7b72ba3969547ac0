"""Shared helpers for typed config: load YAML, validate with pydantic, explain errors.

A config error names the file, the key and, where there is a fixed set, the allowed values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def explain_validation_error(source: str, exc: ValidationError) -> str:
    lines = [f"{source} is invalid:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] in ("literal_error", "enum"):
            expected = (err.get("ctx") or {}).get("expected")
            if expected:
                msg = f"must be one of {expected}"
        lines.append(f"  - {key}: {msg} (got {err.get('input')!r})" if err["type"] != "missing" else f"  - {key}: required")
    return "\n".join(lines)


def validate(model: type[M], data: Any, source: str, *, hint: str | None = None) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain_validation_error(source, exc), hint=hint) from exc


def load_yaml(path: str | Path) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from exc


def load_model_file(model: type[M], path: str | Path, *, hint: str | None = None) -> M:
    return validate(model, load_yaml(path), str(path), hint=hint)
