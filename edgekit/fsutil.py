"""File helpers: hashing and atomic writes (nothing half-written where a good file stood)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import OutputError
from .paths import cache_dir  # noqa: F401  (re-exported: edgekit.fsutil.cache_dir)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file; of a folder (e.g. an .mlpackage), over its sorted relative paths and bytes."""
    p = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        if p.is_dir():
            h.update(f.relative_to(p).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
    return h.hexdigest()


def sha256_files(paths: list[Path]) -> str:
    """SHA-256 of a model that is a set of files (the main file and its companions, e.g. OpenVINO's
    .xml + .bin): over each file's suffix and own hash, in the order given. One file: its own hash."""
    if len(paths) == 1:
        return sha256_file(paths[0])
    h = hashlib.sha256()
    for f in paths:
        h.update(Path(f).suffix.encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def publish_files(pairs: list[tuple[Path, Path]]) -> None:
    """Move a model's files, written and checked aside on the same filesystem, into place: the companions
    first and the main file (``pairs[0]``) last, so a reader that finds the main file finds the rest."""
    for src, dest in [*pairs[1:], pairs[0]]:
        os.replace(src, dest)


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and check it can be written; raise OutputError otherwise."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"output path {p} exists and is not a folder", hint="pass a folder to --out")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=p, prefix=".edgekit-probe-", delete=True)
        probe.close()
    except OSError as exc:
        raise OutputError(
            f"output folder {p} is not writable ({exc.strerror or exc})",
            hint="choose another --out folder or fix its permissions",
        ) from exc
    return p


@contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``dest``; on success rename it over ``dest``, else remove it."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file 0600; a report or model must get the permissions a normal open() gives
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    except BaseException:
        if tmp_path.is_dir():
            shutil.rmtree(tmp_path, ignore_errors=True)
        else:
            tmp_path.unlink(missing_ok=True)
        raise


def atomic_write_text(dest: str | os.PathLike, text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


def atomic_write_bytes(dest: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
    return Path(dest)
