"""Fixtures for the ADB tests: an isolated real adb server and the test device daemon (adbd.py).

The real `adb` client runs with HOME in a temp folder (its keys) and its own server port
(ANDROID_ADB_SERVER_PORT), so a developer's adb server and devices are never touched; the server is
stopped with `adb kill-server` on that port. Import the fixtures into a test module with
``from adb_fixtures import adb_env, adb_device  # noqa: F401``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from adbd import AdbDaemon, Faults

ADB = shutil.which("adb")
needs_adb = pytest.mark.skipif(ADB is None, reason="the real adb client is not installed (apt-get install -y adb)")


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not 5555 <= port <= 5585 and port != 5037:
            return port


class AdbEnv:
    def __init__(self, home: Path, port: int):
        self.home = home
        self.port = port
        self.env = {**os.environ, "HOME": str(home), "ANDROID_ADB_SERVER_PORT": str(port)}

    def adb(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([ADB, *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              stdin=subprocess.DEVNULL)

    def device(self, root: Path, faults: Faults | None = None, **kw) -> AdbDaemon:
        return AdbDaemon(root, faults=faults, **kw).start()


@pytest.fixture(scope="module")
def adb_env(tmp_path_factory):
    """An isolated adb server (own HOME and port), set in os.environ for edgekit's adb calls."""
    if ADB is None:
        pytest.skip("the real adb client is not installed (apt-get install -y adb)")
    home = tmp_path_factory.mktemp("adb-home")
    e = AdbEnv(home, free_port())
    old = {k: os.environ.get(k) for k in ("HOME", "ANDROID_ADB_SERVER_PORT")}
    os.environ.update(HOME=str(home), ANDROID_ADB_SERVER_PORT=str(e.port))
    e.adb("start-server")
    try:
        yield e
    finally:
        e.adb("kill-server", timeout=10)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def adb_device(adb_env, tmp_path):
    """A healthy test device on loopback; its workdir lies inside the daemon's root."""
    d = adb_env.device(tmp_path / "device-root")
    try:
        yield d
    finally:
        adb_env.adb("disconnect", f"127.0.0.1:{d.port}")
        d.stop()
