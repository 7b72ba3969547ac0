"""Nothing built twice (issue #45 item 3): a language model's exports, quantizations and lowerings cached by
content. The key is a SHA-256 over what decides the file: the source's weights and config (``LMSource.sha256``
and the config's fields), the row and its settings (context, the layer plan an int4 file is lowered from, the
calibration an int4 row checks itself with), the versions of the libraries that make it and the source of
edgekit's exporters. A second deploy of the same model (another gate setting, a ``--baseline`` release check)
copies the stored file into ``OUT/artifacts`` and its lineage's last step says ``cache: cache hit ...``.

Location: ``$EDGEKIT_HOME/cache/lm-builds`` (else ``$XDG_CACHE_HOME/edgekit/lm-builds``); ``EDGEKIT_NO_CACHE=1``
turns it off. Entries are written to a temporary folder and renamed into place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ..artifact import Artifact
from ..fsutil import sha256_file
from ..paths import cache_dir
from ..version import installed_versions

LIBRARIES = (
    "edgekit",
    "numpy",
    "torch",
    "transformers",
    "onnx",
    "onnxruntime",
    "torchao",
    "executorch",
    "llama_cpp_python",
    "gguf",
)
# edgekit's own code that decides a file's bytes
EXPORTERS = (
    "export_onnx.py",
    "export_executorch.py",
    "export_gguf.py",
    "layer_plan.py",
    "llama_cpp.py",
    "gguf_source.py",
)


def disabled() -> bool:
    return os.environ.get("EDGEKIT_NO_CACHE", "").strip() not in ("", "0")


@lru_cache(maxsize=1)
def _fingerprint() -> dict[str, Any]:
    libs = installed_versions(LIBRARIES)
    here = Path(__file__).parent
    code = hashlib.sha256(b"".join((here / f).read_bytes() for f in EXPORTERS if (here / f).is_file())).hexdigest()
    return {"libraries": libs, "exporters": code[:16]}


def source_key(src: Any) -> dict[str, Any] | None:
    """The source's part of a key (None: the source has no content hash, nothing is cached)."""
    if not getattr(src, "sha256", None):
        return None
    cfg = src.config.to_dict() if hasattr(src.config, "to_dict") else dict(vars(src.config))
    return {"sha256": src.sha256, "config": {k: v for k, v in cfg.items() if not k.startswith("_")}}


def key_for(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({**doc, **_fingerprint()}, sort_keys=True, default=str).encode()).hexdigest()


def _entry(key: str) -> Path:
    return cache_dir("lm-builds") / key[:2] / key


def _restore(key: str, out_dir: Path) -> Artifact | None:
    entry = _entry(key)
    try:
        meta = json.loads((entry / "artifact.json").read_text())
        art = Artifact.model_validate({**meta, "path": entry / Path(meta["path"]).name})
        if sha256_file(art.path) != art.sha256 and len(art.files) == 1:
            shutil.rmtree(entry, ignore_errors=True)  # damaged: never trusted, rewritten by this run
            return None
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in art.files[1:] + art.files[:1]:  # the main file last
            tmp = out_dir / f".{f.name}.partial"
            shutil.copyfile(f, tmp)
            os.replace(tmp, out_dir / f.name)
    except (OSError, ValueError, KeyError):
        return None
    return art.model_copy(update={"path": (out_dir / art.path.name).resolve()})


def _store(key: str, art: Artifact, seconds: float) -> None:
    entry = _entry(key)
    if entry.exists():
        return
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}.", dir=entry.parent))
        for f in art.files:
            shutil.copyfile(f, tmp / f.name)
        (tmp / "artifact.json").write_text(art.model_dump_json())
        (tmp / "built.json").write_text(json.dumps({"seconds": round(seconds, 3)}))
        os.replace(tmp, entry)
    except OSError:
        pass  # a cache that cannot be written only costs a rebuild next time
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def hit_note(art: Artifact) -> str | None:
    """The lineage's cache note of a file restored from the cache (None: built by this run)."""
    note = art.lineage[-1].metrics.get("cache") if art.lineage else None
    return note if isinstance(note, str) else None


def cached(doc: dict[str, Any] | None, out_dir: Path, produce: Callable[[], Artifact]) -> Artifact:
    """The file ``produce()`` makes, restored from the cache when the key of ``doc`` (None: not cacheable) is
    there; the restored file's last lineage step says so, with the seconds its build took."""
    if doc is None or disabled():
        return produce()
    key = key_for(doc)
    start = time.perf_counter()
    art = _restore(key, out_dir)
    if art is None:
        made = produce()
        _store(key, made, time.perf_counter() - start)
        return made
    try:
        built_s = f"{json.loads((_entry(key) / 'built.json').read_text())['seconds']:.1f} s"
    except (OSError, ValueError, KeyError):
        built_s = "? s"
    last = art.lineage[-1]
    note = (
        f"cache hit {key[:12]}: restored in {time.perf_counter() - start:.1f} s; built in {built_s} by an earlier run"
    )
    metrics = {**last.metrics, "cache": note}
    return art.model_copy(update={"lineage": (*art.lineage[:-1], last.model_copy(update={"metrics": metrics}))})


__all__ = ["cached", "hit_note", "key_for", "source_key"]
