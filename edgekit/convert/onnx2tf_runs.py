"""onnx2tf's output, kept for this process by exactly what it was given.

A search builds ``tflite-fp32``, ``tflite-int8`` and ``tflite-dynamic`` (``--search``: ``tflite-fp16`` too)
from one ONNX file, and each build ran onnx2tf again: the slow part of the hop (most of a transformer's
conversion time). onnx2tf writes the SavedModel and the fp32/fp16 ``.tflite`` files; the INT8 files are made
from that SavedModel afterwards. So a run is kept under the hash of everything onnx2tf reads: the prepared
ONNX bytes, its keyword arguments (paths left out, the layout-hint file by content), the sample file it loads
instead of downloading, and its version; a second build with the same inputs copies that folder instead of
converting again. Only finished runs are kept (a failure is raised again by its own run), in a temp folder
removed when the process exits, the last ``KEEP`` of them.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

KEEP = 4  # SavedModels of a few models: enough for one search's TFLite candidates
_PATH_ARGS = ("input_onnx_file_path", "output_folder_path", "param_replacement_file")
_lock = threading.Lock()
_runs: OrderedDict[str, Path] = OrderedDict()
_root: Path | None = None


def key(src: Path, kwargs: dict, sample: Path, version: str) -> str:
    """What onnx2tf's output depends on, hashed."""
    h = hashlib.sha256()
    for f in (src, sample):
        h.update(hashlib.sha256(Path(f).read_bytes()).digest())
    args = {k: v for k, v in kwargs.items() if k not in _PATH_ARGS}
    h.update(json.dumps(args, sort_keys=True, default=str).encode())
    hints = kwargs.get("param_replacement_file")
    h.update(Path(hints).read_bytes() if hints else b"-")
    h.update(version.encode())
    return h.hexdigest()


def restore(k: str, dest: Path) -> bool:
    """Copy the kept run ``k`` to ``dest`` (onnx2tf's output folder); False when none is kept."""
    with _lock:
        kept = _runs.get(k)
        if kept is None or not kept.is_dir():
            return False
        _runs.move_to_end(k)
        shutil.copytree(kept, dest)
        return True


def keep(k: str, folder: Path) -> None:
    """Keep a copy of a finished run's output folder (the oldest beyond ``KEEP`` are removed)."""
    global _root
    with _lock:
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="edgekit-onnx2tf-runs-"))
            atexit.register(shutil.rmtree, _root, True)
        dest = _root / k
        if dest.exists():
            return
        tmp = _root / f".{k}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp)
        tmp.rename(dest)
        _runs[k] = dest
        while len(_runs) > KEEP:
            _, old = _runs.popitem(last=False)
            shutil.rmtree(old, ignore_errors=True)


def forget() -> None:
    """Drop every kept run (tests; a process that wants onnx2tf to run again)."""
    with _lock:
        for p in _runs.values():
            shutil.rmtree(p, ignore_errors=True)
        _runs.clear()
