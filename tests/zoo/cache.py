"""Build-once cache for the zoo.

Layout: ``<root>/<key>/<name>/{model.pt2, eval.npz, calib.npz, train.npz, zoo.json}`` where root is
``$EDGEKIT_ZOO_CACHE``, else ``$XDG_CACHE_HOME/edgekit-tests/zoo`` (``~/.cache/edgekit-tests/zoo``): outside
the clone, so a fresh clone (which is what CI is) on a machine that built the zoo before starts warm, and
outside ``$EDGEKIT_HOME``, which the tests point at a temporary folder. The key hashes the zoo's own source
files with the torch and transformers versions, so an edit to a builder or a new library version builds
afresh and old keys are simply left behind.

A model is built into ``<root>/<key>/.tmp-<name>-<pid>/`` and renamed into place, so a reader sees
either nothing or the whole folder; an exclusive ``fcntl`` lock on ``<root>/<key>/<name>.lock``
makes a second process (pytest-xdist, two CI steps) wait for the first instead of building twice."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

HERE = Path(__file__).resolve().parent
FILES = ("model.pt2", "eval.npz", "calib.npz", "train.npz", "zoo.json")


def test_cache_root(name: str, env_var: str) -> Path:
    """``$env_var``, else ``$XDG_CACHE_HOME/edgekit-tests/NAME`` (``~/.cache/...``): built test assets outside
    the clone and outside ``$EDGEKIT_HOME`` (the zoo here, the pretrained models' wheels)."""
    env = os.environ.get(env_var)
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgekit-tests" / name


def root() -> Path:
    return test_cache_root("zoo", "EDGEKIT_ZOO_CACHE")


def key() -> str:
    import torch
    import transformers

    h = hashlib.sha256()
    for f in sorted(HERE.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(f"torch={torch.__version__};transformers={transformers.__version__}".encode())
    return h.hexdigest()[:16]


def complete(d: Path) -> bool:
    return all((d / f).is_file() for f in FILES)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure(name: str, build: Callable[[Path], object]) -> Path:
    """The cached folder of ``name``, calling ``build(tmp_dir)`` under the lock when it is missing."""
    base = root() / key()
    final = base / name
    if complete(final):
        return final
    with _locked(base / f"{name}.lock"):
        if complete(final):  # built by another process while we waited
            return final
        tmp = base / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            if final.exists():  # an incomplete leftover (a build killed mid-rename cannot leave one)
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
