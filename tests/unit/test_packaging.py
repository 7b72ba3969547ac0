"""The wheel must carry every subpackage and the data the library looks up (targets, agent)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "edgekit").rglob("__init__.py")}
    missing = on_disk - listed
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert cfg["package-dir"]["edgekit._targets"] == "targets"
    assert cfg["package-dir"]["edgekit._device_agents"] == "device_agents"


def test_wheel_contains_targets_and_agent(tmp_path):
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("edgekit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "edgekit/_targets/rpi4.yaml" in names
    # the browser page and the lockfile `edgekit setup --target browser` installs its runtimes from (not node_modules)
    assert {f"edgekit/_device_agents/browser/{f}" for f in ("agent.html", "agent.js", "package.json",
                                                            "package-lock.json")} <= names
    assert not any("node_modules" in n for n in names)
    assert "edgekit/variant_search/run.py" in names and "edgekit/train/worker.py" in names
    # every module of the agent package, and the zipapp built from the wheel's copy is the source tree's
    # byte for byte (delivery by content and the measurement cache's keys do not depend on how edgekit came)
    from edgekit.agent.package import build_pyz_bytes, package_dir

    src = package_dir()
    mods = {f"edgekit/_device_agents/edgekit_agent/{p.relative_to(src).as_posix()}" for p in src.rglob("*.py")}
    assert mods and mods <= names, sorted(mods - names)
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    assert build_pyz_bytes(unpacked / "edgekit" / "_device_agents" / "edgekit_agent") == build_pyz_bytes(src)
