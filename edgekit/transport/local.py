"""Run the agent as a subprocess of this host, through the same bundle/request/report path as a
remote device. The 'device' is a working folder; its Python is the one running edgekit unless
told otherwise (that is where the runtimes are installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..errors import TransportError
from ..paths import cache_dir
from .base import CommandResult, Transport


def default_local_workdir() -> Path:
    """``$EDGEKIT_LOCAL_DEVICE_DIR``, else edgekit's cache folder ``local-device`` (under ``$EDGEKIT_HOME`` when
    that is set, as every other folder edgekit keeps: a pipeline that points EDGEKIT_HOME at its workspace finds
    nothing written outside it)."""
    base = os.environ.get("EDGEKIT_LOCAL_DEVICE_DIR")
    if base:
        return Path(base)
    return cache_dir("local-device")


class LocalTransport(Transport):
    kind = "local"

    def __init__(self, workdir: str | Path | None = None, python: str | None = None):
        wd = Path(workdir) if workdir else default_local_workdir()
        try:
            wd.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TransportError(f"cannot create the local device folder {wd}: {exc}") from exc
        super().__init__(str(wd), python or sys.executable)

    def run(self, argv: list[str], *, timeout: float, cwd: str | None = None) -> CommandResult:
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                argv,
                cwd=self.remote_path(cwd) if cwd else self.workdir,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"command timed out after {timeout:.0f} s: {argv[0]} ...",
                                 hint="raise the timeout or lower runs/min_seconds") from exc
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]}: {exc}") from exc
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)

    def push(self, local: Path, remote: str) -> None:
        dest = Path(self.remote_path(remote))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.partial")
        try:
            if Path(local).is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(local, tmp)
                if dest.exists():
                    shutil.rmtree(dest)
            else:
                shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        except OSError as exc:
            raise TransportError(f"cannot copy {local} to {dest}: {exc}") from exc
        self.bytes_sent += Path(local).stat().st_size if Path(local).is_file() else 0

    def pull(self, remote: str, local: Path) -> None:
        src = Path(self.remote_path(remote))
        try:
            shutil.copyfile(src, local)
        except OSError as exc:
            raise TransportError(f"cannot copy {src} from the device: {exc}") from exc
