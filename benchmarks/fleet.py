"""A 3-unit sharded fleet run against one unit, and double bookings under contention for one device.

Prints (1) the eval throughput of a sharded fleet run on 3 SSH devices against the same run on one of
them (eval samples per second of the eval pass, which the agent times on each unit; the fleet's is set by
its slowest shard; target >= 2.5x on units with their own CPUs), the device-stage wall time of each (which
also holds what every unit does in full: agent start, warmup, the latency runs) and the whole deploy's wall
time of each, and (2) how often two processes acting as two hosts (separate EDGEKIT_HOMEs, so their host
locks never meet) measured one device at the same time over N rounds (each busy interval logged ON the device;
target 0): through the device-side lease, and through a real labgrid coordinator on loopback (each round a
DeviceSession with EDGEKIT_COORDINATOR set and the device-side lease off, so the coordinator alone keeps them
apart; needs `edgekit[lab]`).
The CPU's ISA is printed beside the figures.

The simulated devices are real sshd servers on loopback (or in network namespaces as root) sharing this
machine's cores: with fewer cores than units the fleet's speed-up is capped by the host, not by edgekit;
the core count is printed beside the ratio.

    sudo .venv/bin/python benchmarks/fleet.py [--samples 24000] [--width 1024] [--rounds 20] [--cpu-quota 0.25]
                                             [--contention-only] [--docs]

``--docs`` writes the two tables into docs/benchmarks/browser-and-fleet.md (its ``fleet`` section, the sharded
eval, and its ``fleet contention`` section; with --contention-only only the latter).

The last run's figures, with the host's CPU and ISA and the commit, are in docs/benchmarks/browser-and-fleet.md
(written by ``--docs``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_cpu.py
from _cpu import isa  # noqa: E402


def build(work: Path, width: int, n: int):
    import numpy as np
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                            torch.nn.ReLU(), torch.nn.Linear(width, 10)).eval()
    x = np.random.default_rng(0).standard_normal((n, 64)).astype("float32")
    with torch.no_grad():
        y = m(torch.from_numpy(x)).argmax(1).numpy()
    torch.onnx.export(m, (torch.from_numpy(x[:1]),), str(work / "m.onnx"), input_names=["x"], dynamo=False)
    np.savez(work / "eval.npz", x=x, y=y)
    return work / "m.onnx", work / "eval.npz"


CONTENDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from edgekit.devices.inventory import get_device, transport_for
    from edgekit.devices.lease import DeviceLease
    busy = ("import sys, time; f = open(sys.argv[1], 'a'); s = time.time(); time.sleep(0.1); "
            "f.write('%r %r\\\\n' % (s, time.time()))")
    t = transport_for(get_device("u0"))  # a simulated device: its inventory entry names this venv's Python
    for i in range({rounds}):
        lease = DeviceLease(t, "u0", ttl_s=20).acquire(wait=True, timeout=300)
        t.run([t.python, "-c", busy, {log!r}], timeout=60)
        lease.release()
    t.close()
""")


# The same contention through the labgrid coordinator: each round one DeviceSession (host lock, the
# device's labgrid place; EDGEKIT_DEVICE_LEASE=0), a busy interval (0.3 s) logged on the device, release.
COORDINATED = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from edgekit.devices.session import DeviceSession
    from edgekit.inputs.targets import load_target
    busy = ("import sys, time; f = open(sys.argv[1], 'a'); s = time.time(); time.sleep(0.3); "
            "f.write('%r %r\\\\n' % (s, time.time()))")
    waited = 0
    for i in range({rounds}):
        with DeviceSession(load_target("local"), "u0", source_io=None, plan=None, lock_timeout=300) as s:
            waited += bool(s.place and s.place.waited_s > 0.05)
            s.transport.run([s.transport.python, "-c", busy, {log!r}], timeout=60)
    print(waited)
""")


def contend(work: Path, code_template: str, tag: str, rounds: int, env: dict) -> tuple[int, int, list, float, str]:
    """Two processes (homes copied from work/home: two hosts) running ``code_template``: the measurements
    logged on the device, the double bookings, exit codes, seconds and their stdout."""
    log = work / f"busy-{tag}.log"
    code = code_template.format(root=str(ROOT), rounds=rounds, log=str(log))
    procs = []
    for h in ("host-a", "host-b"):
        home = work / f"{tag}-{h}"
        shutil.copytree(work / "home", home)
        base = {k: v for k, v in os.environ.items() if k != "EDGEKIT_COORDINATOR"}
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                      env={**base, **env, "EDGEKIT_HOME": str(home)}))
    t0 = time.perf_counter()
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    rcs = [p.returncode for p in procs]
    spans = sorted(tuple(map(float, ln.split())) for ln in log.read_text().splitlines() if ln.strip()) \
        if log.is_file() else []
    double = sum(1 for (_, e0), (s1, _) in zip(spans, spans[1:]) if s1 < e0)
    return len(spans), double, rcs, time.perf_counter() - t0, " + ".join(o.strip() for o in outs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=24000, help="eval samples (the sharded work)")
    ap.add_argument("--width", type=int, default=1024, help="MLP width: bigger = more work per sample")
    ap.add_argument("--rounds", type=int, default=20, help="contention rounds per process")
    ap.add_argument("--cpu-quota", type=float, default=0.25,
                    help="as root: each unit a simulated device (netns) with this CPU quota, so the units have "
                         "their own CPU budget as real boards do (0 = loopback sshd, all sharing the host)")
    ap.add_argument("--contention-only", action="store_true", help="skip the fleet timing; only the two "
                    "contention counts")
    ap.add_argument("--docs", action="store_true", help="write the tables into docs/benchmarks/browser-and-fleet.md "
                    "(its fleet and fleet contention sections)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edgekit-fleet-bench-"))
    os.environ["EDGEKIT_HOME"] = str(work / "home")
    os.environ["EDGEKIT_NO_MEASURE_CACHE"] = "1"
    from sshd import register, start_loopback_sshd

    import edgekit
    from edgekit.inputs.recipe import Recipe

    model, data = build(work, args.width, args.samples)
    servers, sims, coord = [], [], None
    rooted = os.geteuid() == 0 and args.cpu_quota > 0
    try:
        for i in range(3):
            if rooted:
                from edgekit.devices.sim_device import up

                up(f"u{i}", target="local", cpu_quota=args.cpu_quota)
                sims.append(f"u{i}")
            else:
                s = start_loopback_sshd(work / f"sshd{i}")
                servers.append(s)
                register(s, f"u{i}", target="local", workdir=work / f"dev{i}")
        where = (f"3 simulated devices (netns), {args.cpu_quota:g} core each (cgroup)" if rooted else
                 "3 loopback sshd devices sharing the host's cores")
        machine = f"{os.cpu_count()} cores; {where}; {args.samples} eval samples, MLP width {args.width}"
        print(f"machine: {os.cpu_count()} cores, CPU ISA {isa()}; {where}; {args.samples} eval samples, "
              f"MLP width {args.width}")
        guards: list[tuple] = []  # (guard, measurements, double bookings, queued rounds, exit codes, seconds)
        if not args.contention_only:
            common = dict(eval_data=data, target="local", recipe=Recipe(baseline="fp32", variants=[]), runs=10,
                          min_seconds=0.0, warmup=1, shard_eval=True)
            edgekit.deploy(model, devices=["u0", "u1", "u2"], out=work / "warm", **common)  # agent + files delivered
            t0 = time.perf_counter()
            # remeasure: the timed runs never reuse the warm-up run's measurements from the cache
            one = edgekit.deploy(model, devices=["u0"], out=work / "one", remeasure=True, **common)
            t1 = time.perf_counter()
            three = edgekit.deploy(model, devices=["u0", "u1", "u2"], out=work / "three", remeasure=True, **common)
            t2 = time.perf_counter()
            one_s = one.fleet.units[0].seconds
            three_s = max(u.seconds for u in three.fleet.units)
            same = one.variants[0].accuracy.value == three.variants[0].accuracy.value
            # the eval pass alone (the agent times it on each unit): what sharding divides; the rest of the
            # device stage (agent start, warmup, the latency runs every unit makes in full) is per unit
            one_eval = one.fleet.units[0].eval_seconds["fp32"]
            three_eval = max(u.eval_seconds["fp32"] for u in three.fleet.units)
            print(f"eval pass: 1 unit {one_eval:.2f} s for {args.samples} samples, 3 units sharded {three_eval:.2f} s "
                  f"(the slowest shard) -> eval throughput {one_eval / three_eval:.2f}x (target >= 2.5x)")
            print(f"device stage: 1 unit {one_s:.2f} s, 3 units sharded {three_s:.2f} s -> {one_s / three_s:.2f}x"
                  + ("" if rooted else f" (capped near {os.cpu_count()}x by this host's cores)"))
            print(f"whole deploy: 1 unit {t1 - t0:.2f} s, 3 units {t2 - t1:.2f} s; same metric: {same} "
                  f"({three.variants[0].accuracy.value})")
            if args.docs:
                _write_docs("fleet", fleet_table(machine, rooted, [
                    ("eval pass (the agent's timing; 3 units: the slowest shard)", one_eval, three_eval,
                     "eval throughput"),
                    ("device stage (agent start, warmup, latency runs, eval)", one_s, three_s, "device stage"),
                    ("whole deploy", t1 - t0, t2 - t1, "whole deploy")],
                    f"{one.variants[0].accuracy.value} and {three.variants[0].accuracy.value}"
                    f" ({'the same' if same else 'DIFFERENT'})"))

        n, double, rcs, secs, _ = contend(work, CONTENDER, "lease", args.rounds, {})
        print(f"contention: 2 processes x {args.rounds} rounds on one device through the device-side lease: "
              f"{n} measurements, {double} double bookings (target 0), exit codes {rcs}, {secs:.1f} s")
        guards.append(("device-side lease", n, double, None, rcs, secs))
        ok = double == 0 and rcs == [0, 0]
        try:
            import labgrid.remote.client  # noqa: F401
        except ImportError:
            print("contention through a labgrid coordinator: skipped (labgrid is not installed: "
                  "pip install 'edgekit[lab]')")
            if args.docs:
                guards.append(("labgrid coordinator", None, "not measured: labgrid is not installed "
                               "(`pip install 'edgekit[lab]'`)", None, None, None))
                _write_docs("fleet contention", contention_table(machine, args.rounds, guards))
            return 0 if ok else 1
        from lab_coordinator import start_coordinator

        from edgekit.devices.coordinator import Coordinator, parse_address
        from edgekit.devices.inventory import get_device
        from edgekit.lab.export import export_places

        coord = start_coordinator(work / "coordinator")
        with Coordinator(parse_address(coord.address)) as c:
            export_places(c, [get_device("u0")])
        n, double, rcs, secs, waits = contend(work, COORDINATED, "coordinator", args.rounds,
                                              {"EDGEKIT_COORDINATOR": coord.address, "EDGEKIT_DEVICE_LEASE": "0"})
        print(f"contention: 2 processes x {args.rounds} rounds on one device through a labgrid coordinator "
              f"(labgrid {_labgrid_version()}, device-side lease off): {n} measurements, {double} double bookings "
              f"(target 0), rounds that queued behind the other host: {waits}, exit codes {rcs}, {secs:.1f} s")
        guards.append((f"labgrid {_labgrid_version()} coordinator (device-side lease off)", n, double, waits, rcs,
                       secs))
        ok = ok and double == 0 and rcs == [0, 0]
        # the control: the same two processes with no reservation at all (the check must see overlaps)
        n, double, rcs, secs, _ = contend(work, COORDINATED, "none", args.rounds, {"EDGEKIT_DEVICE_LEASE": "0"})
        print(f"control: the same without any reservation (no coordinator, no device-side lease): {n} measurements, "
              f"{double} double bookings, {secs:.1f} s")
        guards.append(("none (the control: no coordinator, no device-side lease)", n, double, None, rcs, secs))
        if args.docs:
            _write_docs("fleet contention", contention_table(machine, args.rounds, guards))
        return 0 if ok else 1
    finally:
        if coord is not None:
            coord.stop()
        for s in servers:
            s.stop()
        if sims:
            from edgekit.devices.sim_device import down

            for n in sims:
                down(n)
        shutil.rmtree(work, ignore_errors=True)


def _write_docs(section: str, body: str) -> None:
    from _docs import write_section

    write_section(ROOT / "docs" / "benchmarks" / "browser-and-fleet.md", section, body)


def fleet_table(machine: str, rooted: bool, rows: list[tuple], metric: str) -> str:
    """The sharded-eval figures as markdown: seconds on 1 unit and on 3, and the ratio."""
    lines = [f"{machine[0].upper()}{machine[1:]}; both runs remeasured (never from the cache).", "",
             "| seconds | 1 unit | 3 units, sharded | 1 unit / 3 units |", "|---|---|---|---|"]
    for what, one, three, _ in rows:
        lines.append(f"| {what} | {one:.2f} | {three:.2f} | {one / three:.2f}x |")
    lines += ["", f"The metric on 1 unit and on 3: {metric}."
              + ("" if rooted else " The units share this host's cores: the ratios are capped by the host.")]
    return "\n".join(lines)


def contention_table(machine: str, rounds: int, guards: list[tuple]) -> str:
    """Double bookings per guard as markdown: two processes acting as two hosts, each ``rounds`` rounds."""
    lines = [f"{machine.split(';')[0]}; {machine.split(';')[1].strip()}; two processes acting as two hosts "
             f"(separate EDGEKIT_HOMEs), {rounds} rounds each, every busy interval logged on the device.", "",
             "| guard | measurements | double bookings | rounds queued behind the other host | seconds |",
             "|---|---|---|---|---|"]
    for guard, n, double, waits, rcs, secs in guards:
        if n is None:
            lines.append(f"| {guard} | {double} | | | |")
            continue
        queued = "-" if waits is None else str(sum(int(w) for w in waits.split(" + ") if w.strip().isdigit()))
        failed = "" if rcs == [0, 0] else f" (exit codes {rcs})"
        lines.append(f"| {guard} | {n}{failed} | {double} | {queued} | {secs:.1f} |")
    return "\n".join(lines)


def _labgrid_version() -> str:
    from importlib.metadata import version

    return version("labgrid")


if __name__ == "__main__":
    sys.exit(main())
