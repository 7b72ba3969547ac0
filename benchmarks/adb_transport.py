"""Issue #6 benchmark: what the adb path costs against the local transport, side by side.

Both transports reach the same host: LocalTransport runs subprocesses directly; AdbTransport goes
through the real adb client and server and the ADB wire protocol to tests/integration/adbd.py on
loopback. So the ratio is adb's own overhead (client start, server hop, shell v2 framing, sync
protocol, on-device hash check), not a phone's speed.

    .venv/bin/python benchmarks/adb_transport.py [--repeats 20] [--mb 8]

Prints the median per-command round trip and the push throughput of each, and their ratios.
Measurements alternate local / adb so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--mb", type=int, default=8, help="size of the pushed file")
    a = ap.parse_args(argv)

    from adb_fixtures import AdbEnv, free_port

    from edgekit.transport.adb import AdbTransport
    from edgekit.transport.local import LocalTransport

    with tempfile.TemporaryDirectory(prefix="edgekit-adb-bench-") as td:
        td = Path(td)
        env = AdbEnv(td / "home", free_port())
        (td / "home").mkdir()
        os.environ.update(HOME=str(env.home), ANDROID_ADB_SERVER_PORT=str(env.port))
        d = env.device(td / "dev")
        payload = td / "payload.bin"
        payload.write_bytes(os.urandom(a.mb * 1024 * 1024))
        local = LocalTransport(td / "local")
        adb = AdbTransport(tcp=f"127.0.0.1:{d.port}", workdir=str(td / "dev" / "wd"), python=sys.executable)
        try:
            rt = {"local": [], "adb": []}
            push = {"local": [], "adb": []}
            for i in range(a.repeats):
                for name, t in (("local", local), ("adb", adb)):
                    t0 = time.perf_counter()
                    r = t.run(["true"], timeout=30)
                    rt[name].append(time.perf_counter() - t0)
                    assert r.ok
                for name, t in (("local", local), ("adb", adb)):
                    if i < max(3, a.repeats // 4):
                        t0 = time.perf_counter()
                        t.push(payload, f"p/payload-{i}.bin")
                        push[name].append(time.perf_counter() - t0)
        finally:
            adb.close()
            d.stop()
            env.adb("kill-server")
    med = {k: statistics.median(v) * 1e3 for k, v in rt.items()}
    mbps = {k: a.mb / statistics.median(v) for k, v in push.items()}
    print(f"command round trip (median of {a.repeats}): local {med['local']:.1f} ms, adb {med['adb']:.1f} ms, "
          f"ratio adb/local {med['adb'] / med['local']:.1f}x")
    print(f"push {a.mb} MB (median of {len(push['adb'])}, adb includes the on-device sha256 + rename): "
          f"local {mbps['local']:.0f} MB/s, adb {mbps['adb']:.0f} MB/s, ratio local/adb {mbps['local'] / mbps['adb']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
