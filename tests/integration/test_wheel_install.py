"""Installed, not cloned (#38): the built wheel alone, in a fresh venv, run from a folder outside the checkout.

    pip install edgekit-*.whl          # plus the CPU torch pin, see below
    edgekit doctor                     # names the browser runtimes as missing and `edgekit setup --target browser`
    edgekit setup --target browser     # npm ci from the lockfile inside the wheel, into the user cache
    edgekit deploy model.pt2 --target local|browser ...

The venv's dependencies come from the package index as a user's would (pip's cache makes it ~30 s here). torch is
pinned to 2.13.0 beside the wheel: on this machine that is the CPU build on local disk, while an unpinned
`torch>=2.5` resolves to a multi-GB CUDA build, the same reason .ci/install.sh pins it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH_PIN = "torch==2.13.0"
FAST = ("--no-search", "--runs", "20", "--min-seconds", "0.2", "--warmup", "3")

pytestmark = pytest.mark.slow


def _source_tree(dest: Path) -> Path:
    """The files a wheel is built from (tracked or not ignored: the working tree as it is), copied out of the
    checkout, so the build writes nothing into it and node_modules cannot slip in."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "pyproject.toml",
                          "README.md", "edgekit", "targets", "device_agents"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a file deleted in the working tree is still in the index
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _run(argv: list, env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_a_fresh_venv_with_only_the_wheel_sets_up_and_deploys_to_local_and_the_browser(tmp_path, digits):
    # the wheel, and what it carries: the targets, the agent package, the browser page and its lockfile
    src = _source_tree(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("edgekit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"edgekit/_device_agents/browser/{f}" for f in ("agent.html", "agent.js", "package.json",
                                                                "package-lock.json")}
    assert shipped <= names and "edgekit/_targets/browser.yaml" in names, sorted(shipped - names)
    assert "edgekit/_device_agents/edgekit_agent/cli.py" in names and "edgekit/transport/web_runtimes.py" in names
    assert not any("node_modules" in n for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py, edgekit = venv / "bin" / "python", venv / "bin" / "edgekit"
    started = time.monotonic()
    r = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheel), TORCH_PIN],
                       capture_output=True, text=True, timeout=900)
    install_s = time.monotonic() - started
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"fresh venv install: {install_s:.0f} s")

    work = tmp_path / "work"  # outside the checkout: nothing of it is importable from here
    work.mkdir()
    for name, f in (("model.pt2", digits.pt2), ("eval.npz", digits.eval), ("calib.npz", digits.calib)):
        shutil.copy(f, work / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "EDGEKIT_BROWSER_RUNTIMES", "EDGEKIT_TARGETS_PATH")}
    env.update(EDGEKIT_HOME=str(tmp_path / "home"), EDGEKIT_LOCAL_DEVICE_DIR=str(tmp_path / "device"),
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    r = _run([py, "-c", "import edgekit, edgekit.transport.web_runtimes as w; print(edgekit.__file__); "
                        "print(w.page_dir())"], env, work)
    assert r.returncode == 0, r.stderr
    module, page = r.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(page).is_relative_to(venv), r.stdout

    # doctor: the browser's runtimes missing, with the command that sets them up
    r = _run([edgekit, "doctor", "--json"], env, work)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["local_agent"]["ok"] and {"local", "browser"} <= set(doc["targets"]), doc
    web = next(s for s in doc["setup"] if (s["target"], s["requirement"]) == ("browser", "web-runtimes"))
    assert not web["present"] and web["fix"] == "edgekit setup --target browser", web

    # before the setup a browser deploy fails as a device failure that names the setup command
    r = _run([edgekit, "deploy", "model.pt2", "--target", "browser", "--eval-data", "eval.npz", "--out", "out-early",
              *FAST], env, work)
    assert r.returncode == 3 and "edgekit setup --target browser" in r.stderr, r.stderr[-2000:]

    r = _run([edgekit, "setup", "--target", "browser", "--json"], env, work, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    acts = {x["requirement"]: x for x in json.loads(r.stdout)["requirements"]}
    assert acts["web-runtimes"]["action"] == "installed", acts
    assert acts["web-runtimes"]["where"].startswith(str(tmp_path / "home" / "cache" / "web-runtimes")), acts

    for target, runtime, version in (("local", "onnxruntime", None), ("browser", "onnxruntime-web", "1.30.0")):
        out = work / f"out-{target}"
        r = _run([edgekit, "deploy", "model.pt2", "--target", target, "--eval-data", "eval.npz", "--calib-data",
                  "calib.npz", "--out", out, *FAST], env, work, timeout=900)
        assert r.returncode == 0, (target, r.stdout[-3000:], r.stderr[-3000:])
        rep = json.loads((out / "report.json").read_text())
        measured = [v for v in rep["variants"] if v.get("latency_ms")]
        assert measured and {v["runtime"]["name"] for v in measured} == {runtime}, rep["variants"]
        assert version is None or {v["runtime"]["version"] for v in measured} == {version}
        assert rep["device"]["transport"] == target and rep["gate"]["passed"] and rep["decision"]["ship"]
        assert runtime in (out / "report.md").read_text()
