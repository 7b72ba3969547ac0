"""The device agent is a package by role shipped as one deterministic zipapp (edgekit/agent/package.py):
two builds are byte-identical, the device and the host run the same bytes, every runtime's runner is its own
module, the host imports only public names, and the agent still runs on the device's Python floor (3.9)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgekit.agent.package import PACKAGE, agent_entries, agent_pyz, build_pyz_bytes, package_dir

ROOT = Path(__file__).resolve().parents[2]
PY39 = next((str(p) for p in sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob("3.9*/bin/python3.9"))),
            None) or (shutil.which("python3.9") if "pyenv/shims" not in (shutil.which("python3.9") or "") else None)


def test_two_builds_are_byte_identical_and_the_zip_is_normalized(tmp_path):
    a, b = build_pyz_bytes(), build_pyz_bytes()
    assert a == b
    # a copy of the sources with other timestamps and permissions builds the same bytes
    copy = tmp_path / PACKAGE
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    for p in copy.rglob("*.py"):
        os.utime(p, (1_700_000_000, 1_700_000_000))
        p.chmod(0o600)
    assert build_pyz_bytes(copy) == a
    # ... and a change to one module changes them
    (copy / "stats.py").write_text((copy / "stats.py").read_text() + "\n# changed\n")
    assert build_pyz_bytes(copy) != a
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(a)
    with zipfile.ZipFile(pyz) as zf:
        names = zf.namelist()
        assert names == sorted(names) and "__main__.py" in names
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    assert a.startswith(b"#!/usr/bin/env python3\n")


def test_the_cached_file_is_named_by_its_content():
    pyz = agent_pyz()
    import hashlib

    assert pyz.name == f"{PACKAGE}-{hashlib.sha256(pyz.read_bytes()).hexdigest()[:16]}.pyz"
    assert agent_pyz() == pyz  # written once


def test_each_runtime_has_its_own_runner_module():
    from edgekit.agent.inprocess import load_agent

    runners = load_agent().runners.RUNNERS
    modules = {cls.__module__ for cls in runners.values()}
    assert len(modules) == len(runners), modules  # one module per runtime
    assert all(m.startswith(f"{PACKAGE}.runners.") and m.endswith("_runner") for m in modules), modules


def test_the_host_imports_only_public_names_of_the_agent():
    """No host module reaches for a private name of the agent (``agent._x`` or ``agent.mod._x``)."""
    offenders = []
    for path in [*(ROOT / "edgekit").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id == "agent" or (
                        isinstance(base, ast.Call) and getattr(base.func, "id", "") == "load_agent"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


def test_the_agent_package_never_imports_edgekit_or_numpy_on_its_probe_path():
    for name, data in agent_entries():
        tree = ast.parse(data.decode())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(m == "edgekit" or m.startswith("edgekit.") for m in mods), (name, mods)
    # --probe, --sha256 and --version on a Python that has no numpy at all
    code = ("import sys; sys.modules['numpy'] = None; sys.argv = ['agent', '--version']; "
            f"sys.path.insert(0, {str(agent_pyz())!r}); from edgekit_agent.cli import main; sys.exit(main(sys.argv))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["ok"], out.stderr
    code = code.replace("'--version'", "'--probe'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["runtimes"], out.stderr


@pytest.mark.skipif(PY39 is None, reason="no Python 3.9 on this host (the device floor); CI's image has pyenv's 3.9")
def test_the_agent_runs_on_python_3_9():
    """The device floor: every module compiles under 3.9, and the zipapp probes there (no numpy needed)."""
    out = subprocess.run([PY39, str(agent_pyz()), "--probe"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["device"]["python"].startswith("3.9"), doc
    out = subprocess.run([PY39, "-c", "import sys, zipfile, compileall\n"
                          "z = zipfile.ZipFile(sys.argv[1])\n"
                          "for n in z.namelist(): compile(z.read(n), n, 'exec')\n", str(agent_pyz())],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_plugin_runner_replaces_a_runtime_and_a_missing_plugin_is_named(tmp_path):
    plugin = tmp_path / "plugin.py"
    plugin.write_text("from edgekit_agent.runners import OnnxRunner, register\n"
                      "@register\nclass Tagged(OnnxRunner):\n    name = 'onnxruntime'\n"
                      "    @classmethod\n    def probe(cls):\n        return 'tagged 1.0', None\n")
    env = {**os.environ, "EDGEKIT_AGENT_PLUGINS": str(plugin)}
    out = subprocess.run([sys.executable, str(agent_pyz()), "--probe"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert json.loads(out.stdout)["runtimes"]["onnxruntime"] == "tagged 1.0"
    env["EDGEKIT_AGENT_PLUGINS"] = str(tmp_path / "missing.py")
    out = subprocess.run([sys.executable, str(agent_pyz()), "--probe"], capture_output=True, text=True, env=env,
                         timeout=120)
    doc = json.loads(out.stdout)
    assert out.returncode == 2 and doc["error"]["kind"] == "bad_request" and "missing.py" in doc["error"]["message"]
