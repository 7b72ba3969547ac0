"""Content-addressed cache of pass outputs: a recipe re-run with nothing changed recomputes nothing.

The key is a SHA-256 over everything that decides a pass's output: the input artifact's sha256, the
pass name and its validated config, the data sets the pass can read (by file hash), the source
files of the passes package, and the versions of the libraries passes use. Any change to one of them is a miss.

Location: ``$EDGEKIT_HOME/cache/passes`` when EDGEKIT_HOME is set, else
``$XDG_CACHE_HOME/edgekit/passes`` (``~/.cache/edgekit/passes``). Set ``EDGEKIT_NO_CACHE=1`` to bypass.
Entries are written to a temporary folder and renamed into place, so a crash never leaves a
half-written entry that a later run would trust.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel

from ..agent.bundle import agent_source
from ..artifact import Artifact, IOSpec, LineageStep
from ..config import validate
from ..formats import Format, model_files
from ..fsutil import sha256_file, sha256_files
from ..inputs.data import Dataset
from ..passes.base import Pass, PassContext
from ..paths import cache_dir
from ..version import installed_versions

# Libraries whose version can change a pass's output (looked up without importing them).
LIBRARIES = ("edgekit", "numpy", "onnx", "onnxruntime", "torch", "torch-pruning", "neural-compressor", "torchao")


def cache_root() -> Path:
    return cache_dir("passes")


def library_versions() -> dict[str, str | None]:
    return installed_versions(LIBRARIES)


@lru_cache(maxsize=256)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    return sha256_file(path)


def _hash_path(p: Path) -> str:
    st = p.stat()
    return _file_hash(str(p), st.st_mtime_ns, st.st_size)


def _extras_fingerprint(extras: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sorted(extras.items()):
        if isinstance(v, Artifact):
            out[k] = v.sha256
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, Path):
            out[k] = _hash_path(v) if v.is_file() else str(v)
        elif hasattr(v, "fingerprint"):  # e.g. the metric plan: which metric scores a pass decides its result
            out[k] = v.fingerprint()
        else:
            out[k] = type(v).__name__  # in-memory objects: identified by kind only
    return out


def cache_key(p: Pass, artifact: Artifact, cfg: BaseModel, ctx: PassContext) -> str:
    return key_for({
        "input": artifact.sha256,
        "pass": p.name,
        "config": cfg.model_dump(mode="json"),
        "data": data_fingerprint(ctx),
        "extras": _extras_fingerprint(ctx.known()),
        "code": code_fingerprint(Path(inspect.getfile(type(p)))),
    })


def code_fingerprint(pass_file: Path) -> str:
    """The pass's module and its sibling modules (shared helpers such as _torch.py, quantize_ort.py),
    plus the converter modules and the agent that passes call into (convert/, device_agents/), so a
    change in the converter itself is never answered from a stale cache entry."""
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]  # edgekit's own: a pass may live elsewhere (a user's, a test's)
    files = [*sorted(pass_file.parent.glob("*.py")), *sorted((pkg / "convert").rglob("*.py")),
             pkg / "inputs" / "source.py", pkg / "artifact.py"]

    files.append(agent_source())
    for f in files:
        # every file named is hashed: a file moved away must fail here, not drop out of the key unseen
        h.update(f.name.encode() + b"\0" + _hash_path(f).encode())
    return h.hexdigest()


def data_fingerprint(ctx: PassContext) -> dict[str, str | None]:
    def fp(ds: Dataset | None) -> str | None:
        if ds is None:
            return None
        stream = getattr(ds, "stream", None)
        if stream is not None:  # constants and state mapping change what calibration feeds: part of the key
            inner = fp(dataclasses.replace(ds, stream=None))
            return hashlib.sha256(f"{inner}:stream={stream.fingerprint()}".encode()).hexdigest()
        if ds.sample is None and ds.path.is_file():
            if list(ds.x_keys) == ["x"]:
                return _hash_path(ds.path)  # the common case, and the key earlier versions wrote
            return hashlib.sha256(f"{_hash_path(ds.path)}:{','.join(ds.x_keys)}:{ds.y_key}".encode()).hexdigest()
        # a subset or a folder of shards: the arrays themselves, in the order used
        h = hashlib.sha256(json.dumps([list(ds.x_keys), ds.sample], default=str).encode())
        for a in (*ds.xs, *([ds.y] if ds.y is not None else [])):
            h.update(str((a.shape, a.dtype)).encode())
            h.update(np.ascontiguousarray(a).data.cast("B"))
        return h.hexdigest()

    return {role: fp(ds) for role, ds in (("calib", ctx.calib), ("eval", ctx.eval), ("train", ctx.train))}


def key_for(doc: dict[str, Any]) -> str:
    """The cache key of a document describing a computation (library versions are added)."""
    doc = {**doc, "libraries": library_versions()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class PassCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else cache_root()
        self.hits = 0
        self.misses = 0

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def run(self, p: Pass, artifact: Artifact, config: dict[str, Any] | BaseModel | None, ctx: PassContext,
            out_name: str) -> Artifact:
        """``p(artifact, config, ctx)`` through the cache."""
        cfg = config if isinstance(config, BaseModel) else validate(
            p.Config, config or {}, f"config of pass '{p.name}'")
        key = cache_key(p, artifact, cfg, ctx)
        return self.cached(key, artifact, ctx.workdir, out_name,
                           lambda: p(artifact, cfg, ctx, out_name=out_name))

    def cached(self, key: str, artifact: Artifact, workdir: Path, out_name: str,
               produce: Callable[[], Artifact]) -> Artifact:
        """The artifact ``produce()`` derives from ``artifact``, restored from the cache when ``key`` is there."""
        hit = self._restore(key, artifact, workdir, out_name)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        art = produce()
        self._store(key, art)
        return art

    def _restore(self, key: str, artifact: Artifact, workdir: Path, out_name: str) -> Artifact | None:
        entry = self._entry(key)
        meta_file = entry / "meta.json"
        if not meta_file.is_file():
            return None
        start = time.perf_counter()
        try:
            meta = json.loads(meta_file.read_text())
            cached = entry / meta["file"]
            files = model_files(cached, meta["format"])
            if (sha256_files(files) if len(files) > 1 else sha256_file(cached)) != meta["sha256"]:
                shutil.rmtree(entry, ignore_errors=True)  # damaged: never trusted, rewritten by this run
                return None
            step = LineageStep.model_validate(meta["step"])
            io = IOSpec.model_validate(meta["io"])
        except (OSError, ValueError, KeyError):
            return None
        workdir.mkdir(parents=True, exist_ok=True)
        dest = workdir / f"{out_name}{Path(meta['file']).suffix}"
        for companion in model_files(cached, meta["format"])[1:]:  # first, so the main file lands last
            _copy_atomic(companion, dest.with_suffix(companion.suffix))
        _copy_atomic(cached, dest)
        step = step.model_copy(update={
            "metrics": {**step.metrics, "cache": {"hit": True, "key": key[:16], "original_seconds": step.seconds}},
            "seconds": round(time.perf_counter() - start, 3)})
        return artifact.derive(dest, fmt=Format(meta["format"]), io=io, step=step, precision=meta["precision"])

    def _store(self, key: str, art: Artifact) -> None:
        entry = self._entry(key)
        if entry.exists():
            return
        tmp = None
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}.", dir=entry.parent))
            name = "artifact" + Path(art.path).suffix
            if Path(art.path).is_dir():
                shutil.copytree(art.path, tmp / name)
            else:
                for f in art.files:  # the main file and its companions (same stem)
                    shutil.copyfile(f, tmp / ("artifact" + f.suffix))
            (tmp / "meta.json").write_text(json.dumps({
                "file": name, "sha256": art.sha256, "format": art.format.value, "precision": art.precision,
                "io": art.io.model_dump(mode="json"), "step": art.lineage[-1].model_dump(mode="json"),
            }, default=str))
            os.replace(tmp, entry)
        except OSError:
            pass  # a cache that cannot be written only costs a recompute next time
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _copy_atomic(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.partial")
    if src.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        if dest.exists():
            shutil.rmtree(dest)
    else:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def default_cache() -> PassCache | None:
    """The cache the pipeline uses, or None when EDGEKIT_NO_CACHE is set."""
    if os.environ.get("EDGEKIT_NO_CACHE", "").strip() not in ("", "0"):
        return None
    return PassCache()


def find_by_sha256(sha256: str, suffix: str = "") -> Path | None:
    """A cached pass output whose content is ``sha256`` (checked again), or None: lets the release
    gate find the baseline report's model when its run folder is gone."""
    if os.environ.get("EDGEKIT_NO_CACHE", "").strip() not in ("", "0"):
        return None
    root = cache_root()
    if not root.is_dir():
        return None
    for meta_file in root.glob("*/*/meta.json"):
        try:
            meta = json.loads(meta_file.read_text())
            if meta.get("sha256") != sha256 or (suffix and not str(meta.get("file", "")).endswith(suffix)):
                continue
            f = meta_file.parent / str(meta["file"])
            files = model_files(f, meta["format"])
            if all(p.is_file() for p in files) and (sha256_files(files) if len(files) > 1 else sha256_file(f)) == sha256:
                return f
        except (OSError, ValueError, KeyError):
            continue
    return None
