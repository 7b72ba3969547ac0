"""edgekit's version, in the root layer: the modules that record it (a report's ``edgekit_version``,
``edgekit --version``) read it here, not from the package's ``__init__`` (the public API, which names them all)."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"


@lru_cache(maxsize=8)
def installed_versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    """Each installed package's version (None: not installed): what a cache key records of the libraries that
    made a file (the pass cache, the language-model build cache)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out
