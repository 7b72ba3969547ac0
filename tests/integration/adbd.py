#!/usr/bin/env python3
"""A small device-side ADB daemon for tests: it speaks the ADB wire protocol to the real `adb`
client and runs commands on THIS host.

No adbd runs on plain Linux, so edgekit's ADB tests stand this one up on loopback and point the
real client at it (`adb connect 127.0.0.1:PORT`). It implements what a device must for
`adb shell` and `adb push/pull`:

- the CNXN handshake without AUTH (banner ``device::...;features=shell_v2,cmd``); A_VERSION
  0x01000001, so checksums are sent but not checked on receipt;
- streams: OPEN / OKAY / WRTE / CLSE, one WRTE in flight per stream (the client OKAYs each), and a
  CLSE answered with CLSE;
- ``shell,v2[,opts]:CMD`` (and ``shell:CMD``, v1): ``/bin/sh -c CMD`` in ``root`` with stdin,
  stdout, stderr and the exit code carried in shell-protocol packets;
- ``sync:``: STAT, LSTAT/STA2/LST2, LIST, SEND (DATA.../DONE, creating parent folders), RECV, QUIT.
  Sync paths must lie under ``root`` (a guard: this daemon writes to the real filesystem).

It emulates ``getprop`` (a script first on the PATH of every command, answering from ``props``).

Fault switches (``faults``):
- ``drop_mid_push``: close the TCP connection after ``drop_after_bytes`` of pushed file data;
- ``offline``: accept the TCP connection but never answer CNXN (adb lists the device ``offline``);
- ``unauthorized``: answer CNXN with AUTH TOKEN and never accept a key (adb: ``unauthorized``).

Stdlib only. Run it by hand: ``python tests/integration/adbd.py --port 15037 --root /tmp/dev``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_VERSION = 0x01000001
MAX_PAYLOAD = 256 * 1024
AUTH_TOKEN = 1

# shell protocol packet ids (adb's shell_protocol.h)
SH_STDIN, SH_STDOUT, SH_STDERR, SH_EXIT, SH_CLOSE_STDIN, SH_WINDOW = 0, 1, 2, 3, 4, 5

SYNC_DATA_MAX = 64 * 1024

DEFAULT_PROPS = {
    "sys.boot_completed": "1",
    "ro.product.model": "edgekit test adbd",
    "ro.product.manufacturer": "edgekit",
    "ro.product.name": "edgekit_adbd",
    "ro.product.device": "adbd",
    "ro.board.platform": "testsoc",
    "ro.hardware": "testsoc",
    "ro.build.version.release": "14",
    "ro.build.version.sdk": "34",
    "ro.product.cpu.abi": "x86_64",
}


@dataclass
class Faults:
    drop_mid_push: bool = False
    drop_after_bytes: int = 64 * 1024
    offline: bool = False
    unauthorized: bool = False


@dataclass
class _Stream:
    local_id: int
    remote_id: int
    conn: "_Connection"
    can_write: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    inpos: int = 0  # read offset into inbox (compacted in blocks: deleting from the front is O(n))
    cond: threading.Condition = field(default_factory=threading.Condition)
    proc: subprocess.Popen | None = None

    def __post_init__(self):
        self.can_write.set()

    # --- out: device -> host, one WRTE in flight until the host OKAYs it
    def write(self, data: bytes) -> bool:
        for i in range(0, len(data), self.conn.max_payload):
            while not self.can_write.wait(0.2):
                if self.closed or self.conn.dead:
                    return False
            if self.closed or self.conn.dead:
                return False
            self.can_write.clear()
            self.conn.send(A_WRTE, self.local_id, self.remote_id, data[i:i + self.conn.max_payload])
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.send(A_CLSE, self.local_id, self.remote_id)
            self.conn.forget(self)
        with self.cond:
            self.cond.notify_all()

    # --- in: host -> device, buffered; readers block on exact byte counts
    def feed(self, data: bytes) -> None:
        with self.cond:
            self.inbox += data
            self.cond.notify_all()

    def read_exact(self, n: int) -> bytes | None:
        with self.cond:
            while len(self.inbox) - self.inpos < n:
                if self.closed or self.conn.dead:
                    return None
                self.cond.wait(0.2)
            out = bytes(self.inbox[self.inpos:self.inpos + n])
            self.inpos += n
            if self.inpos > (1 << 20):
                del self.inbox[:self.inpos]
                self.inpos = 0
            return out


class _Connection:
    def __init__(self, daemon: "AdbDaemon", sock: socket.socket):
        self.d = daemon
        self.sock = sock
        self.send_lock = threading.Lock()
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.max_payload = MAX_PAYLOAD
        self.dead = False
        self.pushed_bytes = 0

    def send(self, cmd: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        header = struct.pack("<6I", cmd, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, cmd ^ 0xFFFFFFFF)
        with self.send_lock:
            if self.dead:
                return
            try:
                self.sock.sendall(header + data)
            except OSError:
                self.kill()

    def kill(self) -> None:
        """Drop the TCP connection (also the 'drop' fault) and stop every stream's process."""
        self.dead = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for s in list(self.streams.values()):
            s.closed = True
            _terminate(s.proc)
            with s.cond:
                s.cond.notify_all()

    def forget(self, s: _Stream) -> None:
        self.streams.pop(s.local_id, None)

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def serve(self) -> None:
        try:
            while not self.dead:
                header = self._recv_exact(24)
                if header is None:
                    break
                cmd, arg0, arg1, length, _check, magic = struct.unpack("<6I", header)
                if magic != cmd ^ 0xFFFFFFFF:
                    break  # not ADB: drop it, as adbd does
                data = self._recv_exact(length) if length else b""
                if data is None:
                    break
                self.dispatch(cmd, arg0, arg1, data)
        finally:
            if not self.dead:
                self.kill()

    def dispatch(self, cmd: int, arg0: int, arg1: int, data: bytes) -> None:
        f = self.d.faults
        if cmd == A_CNXN:
            if f.offline:
                return  # never answer: the client waits and lists the device offline
            if f.unauthorized:
                self.send(A_AUTH, AUTH_TOKEN, 0, os.urandom(20))
                return
            self.max_payload = max(4096, min(arg1 or MAX_PAYLOAD, MAX_PAYLOAD))
            self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, self.d.banner().encode())
        elif cmd == A_AUTH:
            if f.unauthorized and arg0 == 2:  # a signature we refuse: ask again, as a locked phone does
                self.send(A_AUTH, AUTH_TOKEN, 0, os.urandom(20))
            # arg0 == 3 (public key): a phone would show the prompt; nobody answers it here
        elif cmd == A_OPEN:
            service = data.rstrip(b"\0").decode("utf-8", "replace")
            local_id = self.next_id
            self.next_id += 1
            s = _Stream(local_id, arg0, self)
            handler = self.d.handler_for(service)
            if handler is None:
                self.send(A_CLSE, 0, arg0)  # refused
                return
            self.streams[local_id] = s
            self.send(A_OKAY, local_id, arg0)
            threading.Thread(target=_run_handler, args=(handler, s, service), daemon=True).start()
        elif cmd == A_OKAY:
            s = self.streams.get(arg1)
            if s is not None:
                s.remote_id = arg0
                s.can_write.set()
        elif cmd == A_WRTE:
            s = self.streams.get(arg1)
            if s is None:
                self.send(A_CLSE, 0, arg0)
                return
            s.feed(data)
            self.send(A_OKAY, s.local_id, s.remote_id)
        elif cmd == A_CLSE:
            s = self.streams.get(arg1)
            if s is not None:
                _terminate(s.proc)
                s.close()  # answer CLSE with CLSE


def _run_handler(handler, s: _Stream, service: str) -> None:
    try:
        handler(s, service)
    finally:
        s.close()


def _terminate(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


class AdbDaemon:
    """``with AdbDaemon(root, port=0) as d: ...``; ``d.port`` is the TCP port to `adb connect`."""

    def __init__(self, root: str | Path, *, port: int = 0, props: dict[str, str] | None = None,
                 faults: Faults | None = None, serial_name: str = "edgekit_adbd"):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.props = {**DEFAULT_PROPS, **(props or {})}
        self.faults = faults or Faults()
        self.serial_name = serial_name
        if 5555 <= port <= 5585:
            raise ValueError("ports 5555-5585 are the adb server's emulator range; pick another")
        while True:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(("127.0.0.1", port))
            self.port = self._sock.getsockname()[1]
            if port or not 5555 <= self.port <= 5585:
                break
            self._sock.close()  # a free port the client would take for an emulator: draw again
        self._bin = self.root / ".adbd-bin"
        self._write_tools()
        self._conns: list[_Connection] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.services_seen: list[str] = []

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "AdbDaemon":
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for c in list(self._conns):
            c.kill()
        if self._thread:
            self._thread.join(5)
        self._sock.close()

    def drop_connections(self) -> None:
        for c in list(self._conns):
            c.kill()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, sock)
            self._conns = [c for c in self._conns if not c.dead] + [conn]
            threading.Thread(target=conn.serve, daemon=True).start()

    # --- identity ------------------------------------------------------------------------------
    def banner(self) -> str:
        p = self.props
        return (f"device::ro.product.name={p['ro.product.name']};ro.product.model={p['ro.product.model']};"
                f"ro.product.device={p['ro.product.device']};features=shell_v2,cmd")

    def _write_tools(self) -> None:
        self._bin.mkdir(exist_ok=True)
        (self._bin / "props.json").write_text(json.dumps(self.props))
        getprop = self._bin / "getprop"
        getprop.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            f"props = json.load(open({str(self._bin / 'props.json')!r}))\n"
            "if len(sys.argv) > 1:\n"
            "    print(props.get(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ''))\n"
            "else:\n"
            "    [print(f'[{k}]: [{v}]') for k, v in sorted(props.items())]\n")
        getprop.chmod(0o755)

    def set_prop(self, key: str, value: str) -> None:
        self.props[key] = value
        (self._bin / "props.json").write_text(json.dumps(self.props))

    # --- services ------------------------------------------------------------------------------
    def handler_for(self, service: str):
        self.services_seen.append(service)
        if service.startswith("shell"):
            return self._shell
        if service == "sync:":
            return self._sync
        return None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self._bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["ANDROID_ROOT"] = str(self.root)
        return env

    def _shell(self, s: _Stream, service: str) -> None:
        head, _, command = service.partition(":")
        v2 = "v2" in head.split(",")[1:]
        if not command:
            err = b"edgekit test adbd: interactive shells are not supported\n"
            s.write(_sh_packet(SH_STDERR, err) + _sh_packet(SH_EXIT, b"\x01") if v2 else err)
            return
        proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=self.root, env=self._env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        s.proc = proc
        if v2:
            threading.Thread(target=self._shell_stdin, args=(s, proc), daemon=True).start()
        else:
            proc.stdin.close()

        def pump(pipe, packet_id):
            for chunk in iter(lambda: pipe.read1(SYNC_DATA_MAX), b""):
                s.write(_sh_packet(packet_id, chunk) if v2 else chunk)

        pumps = [threading.Thread(target=pump, args=(proc.stdout, SH_STDOUT), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, SH_STDERR), daemon=True)]
        for t in pumps:
            t.start()
        for t in pumps:
            t.join()
        rc = proc.wait()
        if v2 and not s.closed:
            s.write(_sh_packet(SH_EXIT, bytes([rc & 0xFF if rc >= 0 else (128 - rc) & 0xFF])))

    @staticmethod
    def _shell_stdin(s: _Stream, proc: subprocess.Popen) -> None:
        try:
            while True:
                head = s.read_exact(5)
                if head is None:
                    break
                pid, n = head[0], struct.unpack("<I", head[1:])[0]
                data = s.read_exact(n) if n else b""
                if data is None:
                    break
                if pid == SH_STDIN:
                    proc.stdin.write(data)
                    proc.stdin.flush()
                elif pid == SH_CLOSE_STDIN:
                    break
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    # --- sync ----------------------------------------------------------------------------------
    def _inside(self, path: str) -> Path | None:
        p = Path(path)
        if not p.is_absolute():
            p = self.root / p
        p = Path(os.path.normpath(p))
        return p if p == self.root or self.root in p.parents else None

    def _sync(self, s: _Stream, service: str) -> None:
        while True:
            head = s.read_exact(8)
            if head is None:
                return
            ident, n = head[:4], struct.unpack("<I", head[4:])[0]
            if ident == b"QUIT":
                return
            arg = s.read_exact(n) if n else b""
            if arg is None:
                return
            text = arg.decode("utf-8", "replace")
            if ident in (b"STAT", b"LSTA"):
                s.write(self._stat_v1(text))
            elif ident in (b"STA2", b"LST2"):
                s.write(self._stat_v2(ident, text, follow=ident == b"STA2"))
            elif ident == b"LIST":
                self._list(s, text)
            elif ident == b"SEND":
                if not self._recv_file(s, text):
                    return
            elif ident == b"RECV":
                self._send_file(s, text)
            else:
                s.write(_fail(f"unknown sync request {ident!r}"))
                return

    def _stat_v1(self, path: str) -> bytes:
        p = self._inside(path)
        try:
            st = os.stat(p) if p else None
        except OSError:
            st = None
        if st is None:
            return b"STAT" + struct.pack("<3I", 0, 0, 0)
        return b"STAT" + struct.pack("<3I", st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF, int(st.st_mtime))

    def _stat_v2(self, ident: bytes, path: str, follow: bool) -> bytes:
        p = self._inside(path)
        try:
            if p is None:
                raise PermissionError(13, "outside the test device root")
            st = os.stat(p) if follow else os.lstat(p)
        except OSError as exc:
            return ident + struct.pack("<I", exc.errno or 2) + b"\0" * 64
        return ident + struct.pack("<IQQIIIIQqqq", 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid,
                                   st.st_gid, st.st_size, int(st.st_atime), int(st.st_mtime), int(st.st_ctime))

    def _list(self, s: _Stream, path: str) -> None:
        p = self._inside(path)
        try:
            names = sorted(os.listdir(p)) if p else []
        except OSError:
            names = []
        for name in names:
            try:
                st = os.lstat(p / name)
            except OSError:
                continue
            b = name.encode()
            s.write(b"DENT" + struct.pack("<4I", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime), len(b)) + b)
        s.write(b"DONE" + b"\0" * 16)

    def _recv_file(self, s: _Stream, spec: str) -> bool:
        """SEND path,mode then DATA* DONE: write to a temp name, rename on DONE."""
        path, _, mode_s = spec.rpartition(",")
        try:
            mode = int(mode_s) & 0o777 or 0o644
        except ValueError:
            path, mode = spec, 0o644
        dest = self._inside(path)
        tmp = None
        fh = None
        if dest is not None:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.adbd-partial")
                fh = open(tmp, "wb")
            except OSError as exc:
                fh, err = None, f"cannot write {path}: {exc.strerror}"
        else:
            err = f"{path}: outside the test device root {self.root}"
        try:
            while True:
                head = s.read_exact(8)
                if head is None:
                    return False
                ident, n = head[:4], struct.unpack("<I", head[4:])[0]
                if ident == b"DATA":
                    data = s.read_exact(n)
                    if data is None:
                        return False
                    if fh:
                        fh.write(data)
                    s.conn.pushed_bytes += len(data)
                    f = self.faults
                    if f.drop_mid_push and s.conn.pushed_bytes >= f.drop_after_bytes:
                        s.conn.kill()  # the fault: the cable is pulled mid-transfer
                        return False
                elif ident == b"DONE":
                    if fh is None:
                        s.write(_fail(err))
                        return True
                    fh.close()
                    fh = None
                    os.chmod(tmp, mode)
                    os.utime(tmp, (n, n))
                    os.replace(tmp, dest)
                    tmp = None
                    s.write(b"OKAY" + b"\0" * 4)
                    return True
                else:
                    s.write(_fail(f"unexpected {ident!r} in SEND"))
                    return False
        finally:
            if fh:
                fh.close()
            if tmp is not None and tmp.exists():
                tmp.unlink()

    def _send_file(self, s: _Stream, path: str) -> None:
        p = self._inside(path)
        if p is None:
            s.write(_fail(f"{path}: outside the test device root"))
            return
        try:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(SYNC_DATA_MAX), b""):
                    if not s.write(b"DATA" + struct.pack("<I", len(block)) + block):
                        return
        except OSError as exc:
            s.write(_fail(f"{path}: {exc.strerror}"))
            return
        s.write(b"DONE" + b"\0" * 4)


def _sh_packet(packet_id: int, data: bytes) -> bytes:
    return struct.pack("<BI", packet_id, len(data)) + data


def _fail(msg: str) -> bytes:
    b = msg.encode()
    return b"FAIL" + struct.pack("<I", len(b)) + b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="edgekit's test ADB daemon (runs commands on this host)")
    ap.add_argument("--port", type=int, default=15037)
    ap.add_argument("--root", required=True)
    ap.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("--unauthorized", action="store_true")
    ap.add_argument("--drop-after-bytes", type=int, default=None)
    a = ap.parse_args(argv)
    props = dict(p.split("=", 1) for p in a.prop)
    faults = Faults(offline=a.offline, unauthorized=a.unauthorized,
                    drop_mid_push=a.drop_after_bytes is not None, drop_after_bytes=a.drop_after_bytes or 0)
    d = AdbDaemon(a.root, port=a.port, props=props, faults=faults).start()
    print(f"adbd listening on 127.0.0.1:{d.port}; root {d.root}; `adb connect 127.0.0.1:{d.port}`", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
