"""File hashes: content-addressed delivery checks every file on the device by its sha256."""

from __future__ import annotations

import hashlib
import os
from typing import Mapping, Optional


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_sha256(path: str, companions: Optional[Mapping[str, str]] = None) -> str:
    """The hash of a model that may be a set of files (edgekit/fsutil.py ``sha256_files``): one file, its
    own hash; with companions ({suffix: path}), over each file's suffix and hash, the main file first."""
    if not companions:
        return sha256(path)
    h = hashlib.sha256()
    for suffix, p in [(os.path.splitext(path)[1], path), *companions.items()]:
        h.update(suffix.encode() + b"\0" + sha256(p).encode() + b"\n")
    return h.hexdigest()
