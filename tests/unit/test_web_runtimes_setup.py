"""`edgekit setup --target browser` and `edgekit doctor`: the browser's web runtimes installed from the packaged
lockfile into the user cache (atomic: a failed or interrupted npm leaves nothing that is used), found there by
the browser target, and named with the setup command when missing. npm here is a stand-in script on PATH that
records its arguments (the real npm run is tests/integration/test_wheel_install.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from edgekit.agent import browser_transport as browser
from edgekit.errors import DeviceError, TransportError
from edgekit.transport import web_runtimes

ROOT = Path(__file__).resolve().parents[2]
FAKE_NPM = r"""#!/bin/sh
echo "$*" >> "$FAKE_NPM_LOG"
case "$1" in
  --version) echo 10.0.0; exit 0 ;;
  config) echo https://registry.example.invalid/; exit 0 ;;
esac
[ "$1" = ci ] || exit 9
/bin/mkdir -p node_modules/onnxruntime-web/dist node_modules/@litertjs/core/dist
echo '{"version": "1.30.0"}' > node_modules/onnxruntime-web/package.json
if [ -n "$FAKE_NPM_FAIL" ]; then
  echo "npm error code $FAKE_NPM_FAIL" >&2
  echo "npm error network request to https://registry.example.invalid/onnxruntime-web failed" >&2
  exit 1
fi
echo '{"version": "2.5.3"}' > node_modules/@litertjs/core/package.json
echo 'ort' > node_modules/onnxruntime-web/dist/ort.wasm.min.js
echo 'litert' > node_modules/@litertjs/core/dist/index.js
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """An installed edgekit's view: the packaged lockfile without node_modules beside it, an empty user cache,
    a fake npm and node on a PATH that has nothing else (no Chromium either)."""
    page = tmp_path / "page"
    page.mkdir()
    for name in ("package.json", "package-lock.json", "agent.html", "agent.js"):
        shutil.copy(ROOT / "device_agents" / "browser" / name, page / name)
    monkeypatch.setattr(web_runtimes, "page_dir", lambda: page)
    monkeypatch.setattr(browser, "page_dir", lambda: page)
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EDGEKIT_BROWSER_RUNTIMES", raising=False)
    monkeypatch.delenv("EDGEKIT_CHROMIUM", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(FAKE_NPM)
    (bin_dir / "node").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_NPM_LOG", str(tmp_path / "npm.log"))
    return tmp_path


def _cache_entries(host: Path) -> list[str]:
    root = host / "home" / "cache" / "web-runtimes"
    return sorted(p.name for p in root.iterdir() if p.name != ".install.lock") if root.is_dir() else []


def test_not_set_up_names_the_setup_command(host):
    assert web_runtimes.find() is None
    with pytest.raises(DeviceError) as err:
        browser.runtime_dist()
    assert err.value.exit_code == 3
    assert "`edgekit setup --target browser`" in err.value.hint and "EDGEKIT_BROWSER_RUNTIMES" in err.value.hint
    assert browser.litert_dir() is None


def test_setup_installs_from_the_packaged_lockfile_into_the_cache_once(host):
    found = web_runtimes.install()
    key = web_runtimes.lock_key()
    assert found == web_runtimes.Found(host / "home/cache/web-runtimes" / key / "node_modules", "user cache")
    assert _cache_entries(host) == [key]  # nothing else: no temporary folder left
    calls = (host / "npm.log").read_text().splitlines()
    assert calls[0] == "ci --ignore-scripts --no-audit --no-fund --prefer-offline --loglevel=error", calls
    stamp = json.loads((found.node_modules.parent / ".edgekit-web-runtimes.json").read_text())
    assert stamp["key"] == key and stamp["versions"] == {"onnxruntime-web": "1.30.0", "@litertjs/core": "2.5.3"}
    # the browser target serves them from there
    assert browser.runtime_dist() == found.node_modules / "onnxruntime-web" / "dist"
    assert browser.litert_dir() == found.node_modules / "@litertjs" and browser.runtime_version() == "1.30.0"
    # a second setup finds the complete copy and runs no npm
    n = len(calls)
    assert web_runtimes.install() == found
    assert len((host / "npm.log").read_text().splitlines()) == n


def test_the_key_follows_the_lockfile(host):
    before = web_runtimes.lock_key()
    lock = web_runtimes.page_dir() / "package-lock.json"
    lock.write_text(lock.read_text().replace('"1.30.0"', '"1.30.1"', 1))
    assert web_runtimes.lock_key() != before


@pytest.mark.parametrize("code", ["ECONNREFUSED", "ENOTFOUND"])
def test_an_unreachable_registry_is_a_transport_error_and_leaves_no_cache(host, monkeypatch, code):
    monkeypatch.setenv("FAKE_NPM_FAIL", code)
    with pytest.raises(TransportError) as err:
        web_runtimes.install()
    assert err.value.exit_code == 3
    assert "could not reach https://registry.example.invalid/" in err.value.message and code in err.value.message
    assert "npm config set registry" in err.value.hint and "edgekit setup --target browser" in err.value.hint
    assert _cache_entries(host) == []  # npm had written half a node_modules: it is gone, nothing is used
    assert web_runtimes.find() is None


def test_npm_missing_says_what_to_install(host, monkeypatch):
    (host / "bin" / "npm").unlink()
    with pytest.raises(DeviceError) as err:
        web_runtimes.install()
    assert err.value.exit_code == 3 and "`npm` is not installed" in err.value.message
    assert "apt-get install -y nodejs npm" in err.value.hint
    assert _cache_entries(host) == []


def test_an_interrupted_install_is_never_used_and_is_cleaned_by_the_next(host):
    key = web_runtimes.lock_key()
    root = host / "home/cache/web-runtimes"
    # a killed npm (its temporary folder) and a final folder without its stamp (copied by hand, half done)
    for d in (root / f".{key}.building-999999", root / key):
        (d / "node_modules/onnxruntime-web/dist").mkdir(parents=True)
        (d / "node_modules/onnxruntime-web/dist/ort.wasm.min.js").write_text("half")
    assert web_runtimes.find() is None
    with pytest.raises(DeviceError):
        browser.runtime_dist()
    web_runtimes.install()
    assert _cache_entries(host) == [key] and web_runtimes.complete(root / key)


def test_the_environment_variable_wins_and_a_wrong_one_is_named(host, monkeypatch, tmp_path):
    web_runtimes.install()
    mine = tmp_path / "mine"
    (mine / "node_modules/onnxruntime-web/dist").mkdir(parents=True)
    (mine / "node_modules/onnxruntime-web/dist/ort.wasm.min.js").write_text("x")
    monkeypatch.setenv("EDGEKIT_BROWSER_RUNTIMES", str(mine))
    assert browser.runtime_dist() == mine / "node_modules/onnxruntime-web/dist"
    monkeypatch.setenv("EDGEKIT_BROWSER_RUNTIMES", str(tmp_path / "nowhere"))
    with pytest.raises(DeviceError) as err:  # not a silent fall-back to the cache
        browser.runtime_dist()
    assert "EDGEKIT_BROWSER_RUNTIMES=" in err.value.message


def test_the_source_tree_copy_still_comes_first():
    # this clone after .ci/install.sh (npm ci in device_agents/browser): the page's own node_modules
    nm = ROOT / "device_agents" / "browser" / "node_modules"
    if not (nm / "onnxruntime-web/dist/ort.wasm.min.js").is_file():
        pytest.skip("this clone has no device_agents/browser/node_modules (bash .ci/install.sh)")
    assert web_runtimes.find() == web_runtimes.Found(nm, "source tree")


def test_doctor_lists_the_missing_runtimes_with_the_setup_command(cli, host):
    r = cli("doctor", "--json")
    doc = json.loads(r.stdout)
    rows = {(s["target"], s["requirement"]): s for s in doc["setup"]}
    web = rows[("browser", "web-runtimes")]
    assert not web["present"] and web["fix"] == "edgekit setup --target browser" and web["by_edgekit"]
    chromium = rows[("browser", "chromium")]
    assert not chromium["present"] and "apt-get install -y chromium" in chromium["fix"]
    assert ("arm64-twin", "arm64-rootfs") in rows and rows[("arm64-twin", "arm64-rootfs")]["by_edgekit"]
    assert not any(s["target"] == "local" for s in doc["setup"])  # the local target needs nothing more
    # the Pi 5 lists a host-built llama.cpp wheel: its cross compiler and cmake are named with their install
    # commands (nothing on this PATH has them); the Pi 4 lists none, so neither is asked of it
    gxx = rows[("rpi5", "aarch64-linux-gnu-g++")]
    assert not gxx["present"] and gxx["fix"] == "apt-get install -y g++-aarch64-linux-gnu" and "llama.cpp" in gxx["for"]
    assert rows[("rpi5", "cmake")]["fix"] == "apt-get install -y cmake"
    assert ("rpi4", "cmake") not in rows and ("rpi4", "paramiko") in rows
    r = cli("doctor")
    assert "browser: missing web-runtimes" in r.stdout and "-> edgekit setup --target browser" in r.stdout
    web_runtimes.install()
    doc = json.loads(cli("doctor", "--json").stdout)
    web = next(s for s in doc["setup"] if (s["target"], s["requirement"]) == ("browser", "web-runtimes"))
    assert web["present"] and web["fix"] is None and "user cache" in web["where"]


def test_setup_command_installs_and_names_what_it_cannot(cli, host, monkeypatch):
    r = cli("setup", "--target", "browser", "--json")
    doc = json.loads(r.stdout)
    acts = {x["requirement"]: x for x in doc["requirements"]}
    assert acts["web-runtimes"]["action"] == "installed" and web_runtimes.find() is not None
    # no Chromium on this PATH: setup cannot install it, names the command and fails with 3
    assert acts["chromium"]["action"] == "missing" and "apt-get install -y chromium" in acts["chromium"]["fix"]
    assert r.exit_code == 3 and not doc["ok"]
    chromium = host / "bin" / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)
    r = cli("setup", "--target", "browser")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "browser: ok web-runtimes" in r.stdout and "browser: ok chromium" in r.stdout


def test_setup_refuses_nothing_to_do_and_unknown_targets(cli, host):
    r = cli("setup", "--target", "no-such-board")
    assert r.exit_code == 2 and "known targets" in r.stderr
    r = cli("setup", "--json")
    assert r.exit_code == 2 and "--target" in r.stderr
    r = cli("setup", "--target", "local")
    assert r.exit_code == 0 and "local: nothing to set up" in r.stdout


def test_setup_failure_is_reported_with_its_hint(cli, host, monkeypatch):
    monkeypatch.setenv("FAKE_NPM_FAIL", "EAI_AGAIN")
    r = cli("setup", "--target", "browser")
    assert r.exit_code == 3
    assert "browser: failed web-runtimes" in r.stdout and "could not reach" in r.stderr and "npm config set" in r.stderr
    assert _cache_entries(host) == []


def test_setup_twin_builds_the_rootfs_through_the_sim_module_once(cli, host, monkeypatch):
    from edgekit.devices import sim_arm64 as arm64

    rootfs = host / "rootfs" / "debian-bookworm-arm64-v1"
    built: list[int] = []

    def fake_ensure_rootfs(say):
        built.append(1)
        rootfs.mkdir(parents=True)
        (rootfs / arm64.STAMP).write_text("{}")
        return arm64.Rootfs(rootfs, True, 1.0)

    monkeypatch.setattr(arm64, "rootfs_dir", lambda: rootfs)
    monkeypatch.setattr(arm64, "ensure_host", lambda: {})
    monkeypatch.setattr(arm64, "ensure_rootfs", fake_ensure_rootfs)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for tool in ("qemu-aarch64-static", "debootstrap"):
        (host / "bin" / tool).write_text("#!/bin/sh\n")
        (host / "bin" / tool).chmod(0o755)
    doc = json.loads(cli("doctor", "--json").stdout)
    row = next(s for s in doc["setup"] if s["requirement"] == "arm64-rootfs")
    assert not row["present"] and row["fix"] == "edgekit setup --twin"
    r = cli("setup", "--twin", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    acts = {x["requirement"]: x["action"] for x in json.loads(r.stdout)["requirements"]}
    assert acts == {"root": "present", "qemu-aarch64-static": "present", "debootstrap": "present",
                    "arm64-rootfs": "installed"}
    r = cli("setup", "--twin", "--json")
    assert r.exit_code == 0 and built == [1]  # the second run finds it
