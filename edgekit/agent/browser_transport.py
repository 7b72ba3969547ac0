"""The browser as a device: a page in a real headless Chromium, running models with ONNX Runtime Web (WASM).

The "device" is this host's browser: a loopback HTTP server (``127.0.0.1``, a free port) serves the page
agent (``device_agents/browser/agent.html`` + ``agent.js``), the runtime's files (npm-installed at setup by
``edgekit setup --target browser``, never fetched at run time: edgekit/transport/web_runtimes.py says where they
are looked up) and the delivered files, with the
COOP/COEP headers that make the page cross-origin isolated (WASM threads need SharedArrayBuffer; the timer
is 5 us instead of 100 us). Chromium runs headless with every host name unresolvable but the loopback
address (``MAP * ~NOTFOUND, EXCLUDE 127.0.0.1``), so the page reaches nothing but the server.

Delivery and hashing work as on the local target (the files land in the served folder); the agent command
(``python edgekit_agent-<sha>.pyz request.json``) goes to the page through ``browser_bridge.py``, and
``--probe`` answers with the browser's facts. A browser that exits or stops answering is a transport failure (exit 3);
a model ONNX Runtime Web cannot load is the variant's failure. The page reads its WASM thread count once,
so a request for another count reloads it.

A transport that runs the agent's own request code in-process (``browser_bridge``), so it sits in agent/, above
the transports it builds on (``transport/local.py``, ``transport/web_runtimes.py``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..errors import DeviceError, TransportError
from ..fsutil import sha256_file
from ..sim.procs import descendants, kill_tree
from ..transport.base import CommandResult
from ..transport.local import LocalTransport, default_local_workdir
from ..transport.web_runtimes import find, node_modules, page_dir
from .browser_bridge import measure_in_page, probe_page

PAGE_FILES = ("agent.html", "agent.js")
RUNTIME_PACKAGE = "onnxruntime-web"
HELLO_TIMEOUT_S = 60.0
POLL_S = 15.0  # the page's long poll for a job
HEADERS = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
           "Cache-Control": "no-store"}
TYPES = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
         ".json": "application/json"}
INSTALL_HINT = "`edgekit setup --target browser` installs them (npm ci from edgekit's packaged lockfile)"


def runtime_dist() -> Path:
    """ONNX Runtime Web's dist folder (edgekit/transport/web_runtimes.py: $EDGEKIT_BROWSER_RUNTIMES, the source
    tree's node_modules or the user cache); a DeviceError naming `edgekit setup --target browser` when none."""
    return node_modules() / RUNTIME_PACKAGE / "dist"


def runtime_version() -> str | None:
    try:
        return json.loads((runtime_dist().parent / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError, DeviceError):
        return None


def litert_dir() -> Path | None:
    """LiteRT.js's package folder (``@litertjs/core``: dist/ and wasm/), None where it is not installed."""
    found = find()
    base = found.node_modules / "@litertjs" if found else None
    return base if base is not None and (base / "core" / "dist" / "index.js").is_file() else None


def litert_version() -> str | None:
    d = litert_dir()
    try:
        return json.loads((d / "core" / "package.json").read_text())["version"] if d else None
    except (OSError, ValueError, KeyError):
        return None


def chromium_path() -> str:
    exe = os.environ.get("EDGEKIT_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if not exe:
        raise DeviceError("no Chromium found for the browser target",
                          hint="apt-get install -y chromium (.ci/install.sh does it), or set EDGEKIT_CHROMIUM")
    return exe


def chromium_version(exe: str) -> str | None:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+\.\d+\.\d+\.\d+)", out)
    return m.group(1) if m else (out.strip() or None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, page: BrowserPage):
        self.page = page
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):  # the page's traffic is not edgekit's output
        pass

    def _send(self, code: int, body: bytes = b"", ctype: str = "application/octet-stream"):
        self.send_response(code)
        for k, v in HEADERS.items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the page went away (closed, reloaded, killed)
            pass

    def _file(self, root: Path, rel: str):
        path = (root / rel).resolve()
        if not path.is_relative_to(root.resolve()) or not path.is_file():
            return self._send(404)
        self._send(200, path.read_bytes(), TYPES.get(path.suffix, "application/octet-stream"))

    def do_GET(self):  # noqa: N802 - http.server's name
        page, p = self.server.page, self.path.split("?", 1)[0]
        if p.lstrip("/") in PAGE_FILES:
            return self._file(page_dir(), p.lstrip("/"))
        if p.startswith("/ort/"):
            return self._file(page.dist, p[len("/ort/"):])
        if p.startswith(("/litert/", "/litert-utils/")) and page.litert is not None:
            sub = "core" if p.startswith("/litert/") else "wasm-utils/dist"
            return self._file(page.litert / sub, p.split("/", 2)[2])
        if p.startswith("/files/"):
            return self._file(Path(page.workdir), p[len("/files/"):])
        if p.startswith("/tensor/"):
            body = page.tensors.get(p[len("/tensor/"):])
            return self._send(200, body) if body is not None else self._send(404)
        if p == "/job":
            try:
                job = page.jobs.get(timeout=POLL_S)
            except queue.Empty:
                return self._send(204)
            return self._send(200, json.dumps(job).encode(), "application/json")
        self._send(404)

    def do_POST(self):  # noqa: N802
        page, p = self.server.page, self.path
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if p == "/hello":
            page.hello = json.loads(body or b"{}")
            page.hello_event.set()
        elif p.startswith("/result/"):
            page.results.put((p[len("/result/"):], json.loads(body or b"{}")))
        elif p.startswith("/upload/"):
            shape = json.loads(self.headers.get("X-Shape") or "[]")
            page.uploads[p[len("/upload/"):]] = (self.headers.get("X-Dtype"), shape, body)
        else:
            return self._send(404)
        self._send(200)


class DevTools:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe`` (NUL-terminated JSON on the browser's
    fds 3 and 4): no port, no websocket, reachable only by the process that started the browser."""

    def __init__(self, to_browser: int, from_browser: int):
        self.wfd, self.rfd, self._id, self._buf = to_browser, from_browser, 0, b""

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        import select

        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                doc = json.loads(raw)
                if doc.get("id") == self._id:  # events and other answers are skipped
                    if "error" in doc:
                        raise TransportError(f"DevTools {method} failed: {doc['error'].get('message')}")
                    return doc.get("result") or {}
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise TransportError(f"DevTools {method}: no answer from the browser in {timeout:.0f} s")
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise TransportError(f"DevTools {method}: the browser closed its debugging pipe")
            self._buf += chunk

    def close(self) -> None:
        for fd in (self.wfd, self.rfd):
            try:
                os.close(fd)
            except OSError:
                pass


class BrowserPage:
    """The server, the Chromium process and the page it runs; jobs go in, results come back."""

    def __init__(self, workdir: str, profile=None):
        self.workdir = workdir
        self.litert, self.litert_version = litert_dir(), litert_version()  # None: LiteRT.js not installed
        self.profile = profile  # edgekit.inputs.targets.BrowserProfile: CPU throttling and a phone's viewport, or None
        self.devtools: DevTools | None = None
        self.emulation_applied: dict | None = None
        self.dist = runtime_dist()
        self.exe = chromium_path()
        self.version = chromium_version(self.exe)

        self.agent_sha256 = "".join(sha256_file(page_dir() / f)[:16] for f in PAGE_FILES)
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.tensors: dict[str, bytes] = {}
        self.uploads: dict[str, tuple] = {}
        self.hello: dict = {}
        self.hello_event = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.threads: int | None = None
        self._profile = tempfile.mkdtemp(prefix="edgekit-chromium-")
        self.server = _Server(self)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def open(self, threads: int) -> dict:
        """The page up with ``threads`` WASM threads (started, or reloaded when the count differs)."""
        if self.proc is not None and self.alive() and self.threads == threads:
            return self.hello
        self.hello_event.clear()
        if self.proc is None or not self.alive():
            self.close()  # a browser that died: its orphaned helpers go first, and its unanswered jobs
            self.jobs, self.results = queue.Queue(), queue.Queue()
            with open(Path(self._profile) / "chromium.stderr", "ab") as err:
                self.proc = self._start(err, threads)
        else:
            self.jobs.put({"kind": "reload", "threads": threads})
        hello = self._wait_hello(threads)
        self._emulate()
        return hello

    def _emulate(self) -> None:
        """The target's phone profile on the page, through DevTools: the CPU slowed ``cpu_throttle`` times, the
        viewport a phone's. Applied after every (re)load, before any job runs."""
        if self.devtools is None or self.profile is None:
            return
        pages = [t for t in self.devtools.call("Target.getTargets")["targetInfos"]
                 if t.get("type") == "page" and "/agent.html" in t.get("url", "")]
        if not pages:
            raise TransportError("DevTools lists no agent page to throttle", hint="rerun; see chromium.stderr")
        session = self.devtools.call("Target.attachToTarget", {"targetId": pages[0]["targetId"],
                                                               "flatten": True})["sessionId"]
        self.devtools.call("Emulation.setCPUThrottlingRate", {"rate": self.profile.cpu_throttle}, session)
        if self.profile.viewport:
            w, h = self.profile.viewport
            self.devtools.call("Emulation.setDeviceMetricsOverride", {
                "width": w, "height": h, "deviceScaleFactor": self.profile.device_scale_factor,
                "mobile": self.profile.mobile}, session)
        self.emulation_applied = {"cpu_throttle": self.profile.cpu_throttle,
                                  "viewport": list(self.profile.viewport) if self.profile.viewport else None,
                                  "mobile": self.profile.mobile, "via": "DevTools protocol (remote-debugging-pipe)"}

    def _start(self, err, threads: int) -> subprocess.Popen:
        argv = [self.exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
             "--enable-precise-memory-info", "--enable-blink-features=ForceEagerMeasureMemory",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             f"--user-data-dir={self._profile}"]
        page = f"{self.url}/agent.html?threads={threads}"
        # stderr to a file: a pipe would block a read while orphaned helper processes hold it open; its own
        # process group: close() takes the helpers with it
        kw = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": err, "start_new_session": True}
        if self.profile is None:
            return subprocess.Popen([*argv, page], **kw)
        # DevTools over a pipe: Chromium reads commands on fd 3 and answers on fd 4; bash (dash takes no fd above 9)
        # maps our pipe ends onto those numbers (the string holds only these integers) and execs the browser in its
        # place
        cmd_r, cmd_w = os.pipe()
        ans_r, ans_w = os.pipe()
        try:
            proc = subprocess.Popen(["bash", "-c", f'exec "$@" 3<&{cmd_r} 4>&{ans_w} {cmd_r}<&- {ans_w}>&-', "bash",
                                     *argv, "--remote-debugging-pipe", page], pass_fds=(cmd_r, ans_w), **kw)
        finally:
            os.close(cmd_r)
            os.close(ans_w)
        if self.devtools is not None:
            self.devtools.close()
        self.devtools = DevTools(cmd_w, ans_r)
        return proc

    def _wait_hello(self, threads: int) -> dict:
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while not self.hello_event.wait(0.2):
            if not self.alive() or time.monotonic() > deadline:
                why = self.exit_reason() or f"no answer in {HELLO_TIMEOUT_S:.0f} s"
                raise TransportError(f"the browser page did not start ({why})",
                                     hint="run `chromium --headless --no-sandbox about:blank` to see why it fails")
        if "fatal" in self.hello:
            raise TransportError(f"the browser agent failed to start: {self.hello['fatal']}", hint=INSTALL_HINT)
        self.threads = threads
        return self.hello

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_reason(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        try:
            err = (Path(self._profile) / "chromium.stderr").read_text(errors="replace").strip()
        except OSError:
            err = ""
        err = "\n".join(line for line in err.splitlines() if "dbus" not in line.lower())  # no D-Bus here: noise
        return f"Chromium exited with {self.proc.returncode}" + (f": {err.splitlines()[-1]}" if err else "")

    def renderer_pids(self) -> list[int]:
        """The page's renderer processes (children of this Chromium started with --type=renderer)."""

        out = []
        for pid in descendants(self.proc.pid) if self.proc else []:
            try:
                if b"--type=renderer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(pid)
            except OSError:
                continue
        return out

    def run_job(self, job: dict, timeout: float) -> dict:
        """Queue ``job`` and wait for its result; the browser dying or hanging is a TransportError."""
        self.uploads.clear()
        self.jobs.put(job)
        deadline = time.monotonic() + timeout
        while True:
            try:
                jid, doc = self.results.get(timeout=0.5)
            except queue.Empty:
                if not self.alive():
                    raise TransportError(f"the browser died while measuring {job.get('variant')} "
                                         f"({self.exit_reason()})", hint="a crash or an out-of-memory tab: "
                                         "rerun; a model too large for wasm32's 4 GiB cannot run in a page") from None
                if time.monotonic() > deadline:
                    self.close()  # a hung page: the next request starts a fresh browser
                    raise TransportError(f"the browser page did not answer for {job.get('variant')} in "
                                         f"{timeout:.0f} s", hint="raise max_seconds, or lower runs") from None
                continue
            if jid == job["id"]:
                return doc

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                kill_tree(self.proc.pid)
            try:  # the helpers of a browser that died on its own are orphans, still in its process group
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.devtools is not None:
            self.devtools.close()
        self.proc, self.devtools, self.emulation_applied = None, None, None
        self.threads = None


class BrowserTransport(LocalTransport):
    """This host's headless Chromium as the device; files are delivered into the served folder."""

    kind = "browser"

    def __init__(self, workdir: str | Path | None = None, profile=None):
        super().__init__(workdir or default_local_workdir() / ("browser-mobile" if profile else "browser"))
        self.profile = profile  # edgekit.inputs.targets.BrowserProfile or None
        self._page: BrowserPage | None = None

    @property
    def page(self) -> BrowserPage:
        if self._page is None:
            self._page = BrowserPage(self.workdir, self.profile)
        return self._page

    def _agent_call(self, argv: list[str]) -> str | None:
        """The agent argument when ``argv`` runs the agent on a request or a probe (else None)."""
        if len(argv) == 3 and argv[0] == self.python and Path(argv[1]).name.startswith("edgekit_agent-") and \
                (argv[2] == "--probe" or argv[2].endswith(".json")):
            return argv[2]
        return None

    def run(self, argv: list[str], *, timeout: float, cwd: str | None = None) -> CommandResult:
        what = self._agent_call(argv)
        if what is None:  # hashing and the rest: the served folder is on this host
            return super().run(argv, timeout=timeout, cwd=cwd)

        start = time.perf_counter()
        doc, code = probe_page(self.page) if what == "--probe" else measure_in_page(self.page, what, timeout)
        return CommandResult(tuple(argv), code, json.dumps(doc), "", time.perf_counter() - start)

    def describe(self) -> str:
        return f"browser:{self.workdir}"

    def close(self) -> None:
        if self._page is not None:
            self._page.close()
            self._page.server.shutdown()
            self._page.server.server_close()
            shutil.rmtree(self._page._profile, ignore_errors=True)
            self._page = None
        super().close()
