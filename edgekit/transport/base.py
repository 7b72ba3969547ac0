"""The transport contract shared by local, SSH and ADB.

Commands are argv lists, never shell strings built from names: each transport quotes for its
own channel. Paths on the device are POSIX strings relative to ``workdir`` unless absolute.
"""

from __future__ import annotations

import abc
import posixpath
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Transport(abc.ABC):
    """Subclasses implement ``run``, ``push`` and ``pull``; ``close`` is optional."""

    kind: str = "abstract"

    def __init__(self, workdir: str, python: str = "python3"):
        self.workdir = workdir
        self.python = python  # the device's Python command, which runs the agent
        self.bytes_sent = 0  # payload bytes pushed, for content-addressed deploy accounting

    def remote_path(self, rel: str) -> str:
        return rel if rel.startswith("/") else posixpath.join(self.workdir, rel)

    @abc.abstractmethod
    def run(self, argv: list[str], *, timeout: float, cwd: str | None = None) -> CommandResult:
        """Run ``argv`` on the device; raise TransportError when the channel fails (not when the
        command exits non-zero: that is a result)."""

    @abc.abstractmethod
    def push(self, local: Path, remote: str) -> None:
        """Copy a local file to ``remote`` (relative to workdir), atomically (temp name + rename)."""

    @abc.abstractmethod
    def pull(self, remote: str, local: Path) -> None:
        """Copy a device file to ``local``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def describe(self) -> str:
        return f"{self.kind}:{self.workdir}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
