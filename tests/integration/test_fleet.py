"""A fleet run over real sshd devices (edgekit/orchestration/fleet.py) and the device-side lease
(edgekit/devices/lease.py).

Default run: three loopback SSH devices measured in parallel through the pool, sharded eval giving the
metric of one device scoring everything; a unit's sshd killed mid-run (the others finish, the report
names the failed unit, the gate fails with "1 of 3 units unmeasured" unless --min-devices 2); two
processes contending for one device through its lease, with no overlapping measurement on the device.
Slow (root): three simulated devices in network namespaces, one CPU-throttled by a cgroup, which fails
the worst-unit gate by name; two `edgekit deploy` processes with separate homes (two CI hosts) contending
for one device for many rounds, the agent runs logged on the device never overlapping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from device_log import AGENT_LOGGER, overlaps
from sshd import IS_ROOT, needs_sshd, register, start_loopback_sshd

import edgekit
from edgekit.devices.inventory import add_device, get_device
from edgekit.inputs.recipe import Recipe

pytestmark = needs_sshd
FAST = dict(runs=5, min_seconds=0.0, warmup=1)
FP32 = Recipe(baseline="fp32", variants=[])
ROOT = Path(__file__).resolve().parents[2]


def _label(name: str, *labels: str) -> None:
    add_device(get_device(name).model_copy(update={"labels": list(labels)}), replace=True)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A small ONNX MLP and 120 labelled samples (ONNX: no export or torch reference run per deploy); the
    first ten labels are wrong too, so the first third of the set scores lower than the rest (a unit's shard
    score can then be told from another's and from the whole set's)."""
    model, data = _mlp_onnx(tmp_path_factory.mktemp("mlp") / "mlp.onnx", width=128, n=120)
    d = dict(np.load(data))
    d["y"][:10] = (d["y"][:10] + 1) % 10
    np.savez(data, **d)
    return model, data


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def three(home, tmp_path):
    """Three loopback sshd devices u0..u2 in pool local:lab."""
    servers = []
    try:
        for i in range(3):
            s = start_loopback_sshd(tmp_path / f"sshd{i}")
            servers.append(s)
            register(s, f"u{i}", target="local", workdir=tmp_path / f"dev{i}")
            _label(f"u{i}", "lab")
        yield servers
    finally:
        for s in servers:
            s.stop()


def test_sharded_fleet_gives_the_one_device_metric(three, mlp, tmp_path):
    t0 = time.perf_counter()
    one = edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", device="u0", recipe=FP32,
                         out=tmp_path / "one", **FAST)
    t1 = time.perf_counter()
    fleet = edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", pool="local:lab", shard_eval=True,
                           recipe=FP32, out=tmp_path / "fleet", latency_budget_ms=10_000.0, **FAST)
    t2 = time.perf_counter()
    fl = fleet.fleet
    assert fl.mode == "sharded" and fl.measured == fl.total == 3 and fleet.gate.passed, fleet.gate
    shards = [u.shard for u in fl.units]
    n = one.variants[0].accuracy.n
    assert shards[0][0] == 0 and shards[-1][1] == n and all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
    # the shards, put back in order, score exactly what one device scoring everything scores
    assert fleet.variants[0].accuracy.value == one.variants[0].accuracy.value
    assert fleet.variants[0].accuracy.n == n
    assert fleet.variants[0].parity.max_abs_err == pytest.approx(one.variants[0].parity.max_abs_err, abs=1e-6)
    # each unit really scored only its part, and says what its part scored: the top-1 of its shard, computed
    # here on the host (onnxruntime, the same file), and the shards' own scores differ from the whole set's
    import onnxruntime as ort

    sess = ort.InferenceSession(str(mlp[0]), providers=["CPUExecutionProvider"])
    data = np.load(mlp[1])
    pred = np.array([sess.run(None, {"x": x[None]})[0].argmax() for x in data["x"]])
    hit = 100.0 * (pred == data["y"])
    assert one.variants[0].accuracy.value == pytest.approx(hit.mean(), abs=1e-6)
    assert all(set(u.shard_accuracy) == {"fp32"} for u in fl.units)
    got = {u.name: u.shard_accuracy["fp32"] for u in fl.units}
    want = {u.name: float(hit[u.shard[0]:u.shard[1]].mean()) for u in fl.units}
    assert got == pytest.approx(want, abs=1e-6), (got, want)
    assert len(set(want.values())) > 1, want  # the shards score differently: a unit reporting another's would show
    assert {u.transport for u in fl.units} == {"ssh"}
    # each unit's eval pass, timed by the agent on the device (what the benchmark's throughput divides)
    assert all(u.eval_seconds["fp32"] is not None and u.eval_seconds["fp32"] > 0 for u in fl.units)
    v = fl.variants[0]
    assert v.units == 3 and v.worst_p50 >= v.median_of_medians_ms >= v.best_p50 > 0
    # the gate judges the worst unit (all pass here: the slowest p50), and every check names it
    p50 = {u.name: u.latency_ms["fp32"]["p50"] for u in fl.units}
    worst = max(p50, key=p50.get)
    assert v.worst_unit == worst and v.worst_p50 == pytest.approx(p50[worst]), (v, p50)
    assert v.best_unit == min(p50, key=p50.get) and v.median_of_medians_ms == pytest.approx(sorted(p50.values())[1])
    doc = json.loads((tmp_path / "fleet" / "report.json").read_text())
    assert doc["fleet"]["judged_unit"] == fl.judged_unit == worst, (doc["fleet"]["judged_unit"], p50)
    unit_checks = [c for c in fleet.gate.checks if c.name != "fleet_units"]
    assert [c.name for c in unit_checks] == ["latency_p50_budget"], unit_checks
    assert all(c.unit == worst and c.message.startswith(f"unit {worst} (worst of 3 measured): ")
               for c in unit_checks), unit_checks
    junit = (tmp_path / "fleet" / "junit.xml").read_text()
    assert all(f'classname="edgekit.orchestration.fleet" name="u{i}"' in junit for i in range(3))
    md = (tmp_path / "fleet" / "report.md").read_text()
    assert "## Fleet" in md and "| u2" in md
    assert 'id="plot-fleet"' in (tmp_path / "fleet" / "report.html").read_text()
    print(f"\none device {t1 - t0:.1f} s, 3-unit sharded fleet {t2 - t1:.1f} s")


def test_fleet_gate_fails_on_the_worst_unit_by_name(three, mlp, tmp_path):
    """A budget no unit meets: the gate judges the slowest unit and names it in the failed check; each
    other unit adds its own failed fleet_unit_gate check (the throttled-unit version is the slow test below)."""
    r = edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", pool="local:lab", recipe=FP32,
                       out=tmp_path / "o", latency_budget_ms=1e-6, **FAST)
    p50 = {u.name: u.latency_ms["fp32"]["p50"] for u in r.fleet.units}
    worst = max(p50, key=p50.get)
    assert not r.gate.passed and r.fleet.judged_unit == worst and r.fleet.variants[0].worst_unit == worst, p50
    lat = [c for c in r.gate.failed_checks if c.name == "latency_p50_budget"]
    assert len(lat) == 1 and lat[0].unit == worst, r.gate.checks
    assert lat[0].message.startswith(f"unit {worst} (worst of 3 measured): {p50[worst]:.3f} ms > budget"), lat[0]
    others = {c.unit: c.message for c in r.gate.failed_checks if c.name == "fleet_unit_gate"}
    assert set(others) == set(p50) - {worst}, r.gate.checks
    assert all(m.startswith(f"unit {u} also fails: latency_p50_budget [fp32]: ") for u, m in others.items()), others


def test_a_unit_killed_mid_run_is_reported_and_the_others_finish(three, mlp, tmp_path):
    victim = three[1]
    killed = []

    def progress(msg: str) -> None:
        if msg.startswith("[u1] measuring") and not killed:
            victim.stop()  # sshd and its sessions, by PID: the unit's link dies mid-measurement
            killed.append(time.time())

    r = edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", devices=["u0", "u1", "u2"], recipe=FP32,
                       out=tmp_path / "out", progress=progress, **FAST)
    assert killed
    states = {u.name: u for u in r.fleet.units}
    assert states["u1"].state == "failed" and states["u1"].error and states["u1"].exit_code == 3, states["u1"]
    assert states["u0"].state == states["u2"].state == "measured"
    assert states["u0"].latency_ms["fp32"]["p50"] > 0 and states["u2"].latency_ms["fp32"]["p50"] > 0
    check = next(c for c in r.gate.checks if c.name == "fleet_units")
    assert not check.passed and check.message.startswith("1 of 3 units unmeasured (u1:"), check.message
    assert not r.gate.passed  # the CLI exits 1 (gate failed); the report is written
    assert json.loads((tmp_path / "out" / "report.json").read_text())["fleet"]["units"][1]["state"] == "failed"
    assert 'name="u1"' in (tmp_path / "out" / "junit.xml").read_text()
    # --min-devices: the same fault (u1 is still down) is tolerated
    r2 = edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", devices=["u1", "u2"], recipe=FP32,
                        out=tmp_path / "out2", min_devices=1, **FAST)
    c2 = next(c for c in r2.gate.checks if c.name == "fleet_units")
    assert c2.passed and c2.message.startswith("1 of 2 units unmeasured (u1:") and "--min-devices 1 met" in c2.message
    assert r2.gate.passed and r2.fleet.judged_unit == "u2", r2.gate


def test_shard_eval_refuses_eval_data_at_several_shapes_before_any_build(three, tmp_path):
    """Contiguous slices of a set held in shape buckets would cut across shapes: refused by name (exit 2's
    BadInputError), before any variant is built or measured."""
    from edgekit.errors import BadInputError
    from tests.unit.test_shape_buckets import _model

    _model(tmp_path / "lines.onnx")
    d = tmp_path / "lines"
    d.mkdir()
    rng = np.random.default_rng(0)
    for shard, width in enumerate((16, 8)):
        np.save(d / f"x.{shard:05d}.npy", rng.standard_normal((12, 1, 4, width)).astype(np.float32))
        np.save(d / f"y.{shard:05d}.npy", rng.integers(0, 5, 12))
    with pytest.raises(BadInputError, match="--shard-eval splits the eval set .* holds 2 shape buckets"):
        edgekit.deploy(tmp_path / "lines.onnx", eval_data=d, target="local", pool="local:lab", shard_eval=True,
                       out=tmp_path / "o", **FAST)
    assert not (tmp_path / "o" / "report.json").exists()
    assert not list((tmp_path / "o" / "artifacts").iterdir())  # nothing built (the default recipe's INT8 file)


def test_fleet_refuses_a_bad_pool_before_any_work(home, cli, mlp, tmp_path):
    r = cli("deploy", mlp[0], "--eval-data", mlp[1], "--pool", "local:nowhere", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "pool 'local:nowhere' is empty" in r.stderr, r.stderr


# Each round: take the device's lease, "measure" on the device (append start/end of the busy interval to a
# file ON the device, with the device's clock), release. Two such processes = two hosts.
CONTENDER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from edgekit.devices.inventory import get_device, transport_for
    from edgekit.devices.lease import DeviceLease
    busy = "import sys, time; f = open(sys.argv[1], 'a'); s = time.time(); time.sleep(0.15); f.write('%r %r\\\\n' % (s, time.time()))"
    t = transport_for(get_device("shared"))
    t.python = sys.executable
    for i in range({rounds}):
        lease = DeviceLease(t, "shared", ttl_s=20).acquire(wait=True, timeout=120)
        t.run([t.python, "-c", busy, {log!r}], timeout=60)
        lease.release()
    t.close()
""")


def test_two_hosts_contending_through_the_device_lease_never_overlap(home, tmp_path):
    s = start_loopback_sshd(tmp_path / "sshd")
    try:
        register(s, "shared", target="local", workdir=tmp_path / "dev")
        log = tmp_path / "dev-busy.log"  # on the device (the sshd's side of the link)
        rounds = 4
        code = CONTENDER.format(root=str(ROOT), rounds=rounds, log=str(log))
        procs = []
        for h in ("host-a", "host-b"):  # two homes: the host flock cannot see the other "host"
            hh = tmp_path / h
            import shutil

            shutil.copytree(home, hh)
            procs.append(subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "EDGEKIT_HOME": str(hh)}))
        assert [p.wait(timeout=600) for p in procs] == [0, 0]
        n, double = overlaps(log)
        assert n == 2 * rounds and double == 0
    finally:
        s.stop()


def test_deploy_refuses_a_device_leased_from_another_host(home, tmp_path, mlp):
    from edgekit.devices.lease import DeviceLease

    s = start_loopback_sshd(tmp_path / "sshd")
    try:
        register(s, "shared", target="local", workdir=tmp_path / "dev")
        from edgekit.devices.inventory import transport_for

        t = transport_for(get_device("shared"))
        t.python = sys.executable
        other = DeviceLease(t, "shared", ttl_s=120).acquire()  # another host's deploy holds it
        from edgekit.devices.lease import DeviceLeaseHeld

        t0 = time.monotonic()
        with pytest.raises(DeviceLeaseHeld) as ei:
            edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", device="shared", recipe=FP32,
                           out=tmp_path / "o", lock_wait=False, **FAST)
        msg = ei.value.message
        assert ei.value.exit_code == 3 and "leased by another host" in msg and f"PID {os.getpid()}" in msg, msg
        assert "expires in" in msg
        with pytest.raises(DeviceLeaseHeld, match="stayed leased for 2 s"):
            edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", device="shared", recipe=FP32,
                           out=tmp_path / "o", lock_timeout=2.0, **FAST)
        assert not (tmp_path / "o" / "report.json").exists()
        other.release()
        # released: the deploy now goes through
        r = edgekit.deploy(mlp[0], eval_data=mlp[1], target="local", device="shared", recipe=FP32,
                           out=tmp_path / "o", lock_wait=False, **FAST)
        assert r.variants[0].latency_ms.p50 > 0
        print(f"\nrefusals + one deploy: {time.monotonic() - t0:.1f} s")
        t.close()
    finally:
        s.stop()


# --- slow: real namespaces, a throttled unit, two edgekit deploy processes -----------------------------
def _mlp_onnx(path: Path, width: int = 2048, n: int = 24, hidden: int = 1) -> tuple[Path, Path]:
    import torch

    torch.manual_seed(0)
    inner = [layer for _ in range(hidden) for layer in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    m = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), *inner, torch.nn.Linear(width, 10)).eval()
    x = np.random.default_rng(0).standard_normal((n, 64)).astype("float32")
    with torch.no_grad():
        y = m(torch.from_numpy(x)).argmax(1).numpy()
    y[::5] = (y[::5] + 1) % 10  # some wrong labels: the metric is not 100 %, so a mis-joined shard would show
    torch.onnx.export(m, (torch.from_numpy(x[:1]),), str(path), input_names=["x"], dynamo=False)
    np.savez(path.with_suffix(".npz"), x=x, y=y)
    return path, path.with_suffix(".npz")


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces, cgroups)")
def test_throttled_unit_fails_the_worst_unit_gate_by_name(home, tmp_path):
    from edgekit.devices.sim_device import down, up

    # Two 4096x4096 layers: 3-6 ms an inference on the CPUs CI has seen, over the throttled unit's 2 ms CPU slice
    # per 20 ms period (quota 0.1 core), so every inference there waits out at least one period (>= 20 ms against
    # <= 6 ms). With one layer an EPYC's 1.8 ms inference fit in a slice, and a rerun measured slow-c as fast. At
    # quota 0.05 the agent's own start (importing onnxruntime) took twice as long: ~6 min of CI's slow step here.
    model, data = _mlp_onnx(tmp_path / "mlp.onnx", width=4096, hidden=2)
    names = ["fast-a", "fast-b", "slow-c"]
    try:
        for n in names:
            up(n, target="local", cpu_quota=0.1 if n == "slow-c" else None)
            _label(n, "lab")
        opts = dict(eval_data=data, target="local", pool="local:lab", recipe=FP32, runs=10, min_seconds=0.0, warmup=2)
        probe = edgekit.deploy(model, out=tmp_path / "probe", **opts)
        p50 = {u.name: u.latency_ms["fp32"]["p50"] for u in probe.fleet.units}
        assert p50["slow-c"] > 2.5 * max(p50["fast-a"], p50["fast-b"]), p50
        assert probe.fleet.judged_unit == "slow-c" and probe.fleet.variants[0].worst_unit == "slow-c"
        budget = (p50["slow-c"] * max(p50["fast-a"], p50["fast-b"])) ** 0.5  # between the fast units and the slow one
        worst = edgekit.deploy(model, out=tmp_path / "worst", latency_budget_ms=budget, **opts)
        assert not worst.gate.passed and worst.fleet.judged_unit == "slow-c"
        bad = [c for c in worst.gate.failed_checks if c.name.startswith("latency")]
        assert bad and all(c.message.startswith("unit slow-c (worst of 3 measured)") for c in bad), bad
        assert {u.name: u.gate_passed for u in worst.fleet.units} == {"fast-a": True, "fast-b": True, "slow-c": False}
        median = edgekit.deploy(model, out=tmp_path / "median", latency_budget_ms=budget, fleet_gate="median", **opts)
        assert median.gate.passed and median.fleet.judged_unit in {"fast-a", "fast-b"}, median.gate
    finally:
        for n in names:
            try:
                down(n)
            except Exception:
                pass


@pytest.mark.slow
def test_two_edgekit_deploys_on_two_hosts_never_double_book(home, tmp_path, digits):
    """Two `edgekit deploy` processes with separate EDGEKIT_HOMEs (two CI hosts: their host locks never meet)
    deploy to one device for several rounds; the device logs every agent run: no two overlap."""
    s = start_loopback_sshd(tmp_path / "sshd")
    try:
        log = tmp_path / "agent-runs.log"
        wrapper = tmp_path / "logging_python.py"
        wrapper.write_text(AGENT_LOGGER.format(py=sys.executable, log=str(log)))
        register(s, "shared", target="local", workdir=tmp_path / "dev")
        add_device(get_device("shared").model_copy(update={"python": f"{sys.executable} {wrapper}"}), replace=True)
        rounds = int(os.environ.get("EDGEKIT_CONTENTION_ROUNDS", "3"))
        exe = Path(sys.executable).with_name("edgekit")
        recipe = tmp_path / "fp32.yaml"
        recipe.write_text("baseline: fp32\nvariants: []\n")
        # exit 0 or 1 (a gate verdict) is a finished deploy; anything else (2, 3, a crash) fails the test
        script = " ; ".join(f"{exe} deploy {digits.pt2} --device shared --eval-data {digits.eval} --out OUT{i} "
                            f"--recipe {recipe} --runs 20 --min-seconds 0.3 --warmup 1 --lock-timeout 300; "
                            "[ $? -le 1 ] || exit 9" for i in range(rounds))
        procs = []
        import shutil

        for h in ("host-a", "host-b"):
            shutil.copytree(home, tmp_path / h)
            procs.append(subprocess.Popen(["bash", "-c", script.replace("OUT", str(tmp_path / h / "out"))],
                                          env={**os.environ, "EDGEKIT_HOME": str(tmp_path / h),
                                               "EDGEKIT_LEASE_TTL_S": "15"}))
        assert [p.wait(timeout=1800) for p in procs] == [0, 0]
        n, double = overlaps(log)
        assert n >= 2 * rounds and double == 0, (n, double)
    finally:
        s.stop()
