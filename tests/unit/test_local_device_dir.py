"""The local device's working folder follows edgekit's other folders: EDGEKIT_LOCAL_DEVICE_DIR, else the cache
under EDGEKIT_HOME when that is set, else the user's cache (a pipeline pointing EDGEKIT_HOME at its workspace must
find nothing written outside it)."""

from __future__ import annotations

from pathlib import Path

from edgekit.transport.local import default_local_workdir


def test_the_local_device_folder_lives_under_edgekit_home(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGEKIT_LOCAL_DEVICE_DIR", raising=False)
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    assert default_local_workdir() == tmp_path / "home" / "cache" / "local-device"


def test_without_edgekit_home_it_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGEKIT_LOCAL_DEVICE_DIR", raising=False)
    monkeypatch.delenv("EDGEKIT_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_local_workdir() == tmp_path / "xdg" / "edgekit" / "local-device"


def test_the_explicit_folder_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEKIT_LOCAL_DEVICE_DIR", str(tmp_path / "dev"))
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    assert default_local_workdir() == Path(tmp_path / "dev")
