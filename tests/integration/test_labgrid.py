"""Device reservations through a real labgrid coordinator (edgekit/lab/), with real sshd devices.

Default run: a `labgrid-coordinator` on loopback (a free port, stopped by PID); three loopback SSH devices
exported as places (tags, matches) whose resources labgrid's own exporter then publishes; two processes with
separate EDGEKIT_HOMEs (two CI hosts: their host locks never meet; the device-side lease off, so the
coordinator alone keeps them apart) contending for one place, every busy interval logged ON the device: no
overlap; the holder named on refusal (--no-wait, --lock-timeout, `edgekit devices list`); a SIGKILLed
holder's place taken over at once on its host, a dead holder elsewhere after its TTL, a live one never; a
place acquired with labgrid-client never taken over; an unreachable coordinator, a missing place and a
missing labgrid are errors that say what to do.
Slow (root): the same contention between two `edgekit deploy --pool` processes in two network namespaces
(two CI hosts) over a bridge to the coordinator and to three devices in namespaces of their own, 20 rounds
(EDGEKIT_CONTENTION_ROUNDS; .ci/run sets 10). Slow: a restarted coordinator (it forgets its holders) gives the renewing
holder its place back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from device_log import AGENT_LOGGER, overlaps
from lab_coordinator import LabNet, start_coordinator
from sshd import IS_ROOT, needs_sshd, register, start_loopback_sshd

from edgekit.devices.inventory import add_device, get_device

pytest.importorskip("labgrid.remote.client", reason="labgrid not installed (pip install 'edgekit[lab]')")

pytestmark = needs_sshd
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    c = start_coordinator(tmp_path_factory.mktemp("coordinator"))
    yield c
    c.stop()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EDGEKIT_COORDINATOR", raising=False)
    return tmp_path / "home"


@pytest.fixture
def lab(home, coordinator, monkeypatch, request):
    """One loopback sshd device exported as a place named uniquely for this test."""
    from edgekit.devices.coordinator import Coordinator, parse_address
    from edgekit.lab.export import export_places

    name = "d-" + request.node.name[5:40].replace("_", "-").strip("-")
    s = start_loopback_sshd(home.parent / "sshd")
    register(s, name, target="local", workdir=home.parent / "dev")
    with Coordinator(parse_address(coordinator.address)) as c:
        export_places(c, [get_device(name)])
    monkeypatch.setenv("EDGEKIT_COORDINATOR", coordinator.address)
    yield name, s
    s.stop()


def _session(name: str, **kw):
    from edgekit.devices.session import DeviceSession
    from edgekit.inputs.targets import load_target

    return DeviceSession(load_target("local"), name, source_io=None, plan=None, **kw)


def _place(coordinator, name: str):
    from edgekit.devices.coordinator import Coordinator, parse_address

    with Coordinator(parse_address(coordinator.address)) as c:
        return c.places()[name]


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("EDGEKIT_RUN_ID", None)
    return env


# A process that opens a DeviceSession (host lock, labgrid place, device-side lease unless off), says so,
# and holds it for HOLD seconds (0 = until killed).
HOLDER = textwrap.dedent("""
    import sys, time
    from edgekit.devices.session import DeviceSession
    from edgekit.inputs.targets import load_target
    name, hold = sys.argv[1], float(sys.argv[2])
    with DeviceSession(load_target("local"), name, source_io=None, plan=None) as s:
        print("HELD", time.time(), flush=True)
        time.sleep(hold or 3600)
    print("RELEASED", time.time(), flush=True)
""")


def _start_holder(name: str, hold: float = 0.0, **env) -> subprocess.Popen:
    """The holder runs as "another host": a copy of this test's EDGEKIT_HOME, so the host locks never meet."""
    home = Path(os.environ["EDGEKIT_HOME"])
    other = home.parent / f"other-host-{time.monotonic_ns()}"
    shutil.copytree(home, other)
    p = subprocess.Popen([PY, "-c", HOLDER, name, str(hold)], stdout=subprocess.PIPE, text=True,
                         env=_env(EDGEKIT_HOME=str(other), **env))
    line = p.stdout.readline()
    assert line.startswith("HELD"), (line, p.poll())
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)


# --- export --------------------------------------------------------------------------------------
def test_export_three_devices_as_places_with_their_resources(home, coordinator, cli, tmp_path, monkeypatch):
    from edgekit.devices.coordinator import Coordinator, parse_address

    servers = [start_loopback_sshd(tmp_path / f"sshd{i}") for i in range(3)]
    exporter = None
    try:
        for i, s in enumerate(servers):
            register(s, f"x{i}", target="local", workdir=tmp_path / f"dev{i}")
            add_device(get_device(f"x{i}").model_copy(update={"labels": ["lab-A", f"slot{i}"]}), replace=True)
        r = cli("lab", "export", "--coordinator", coordinator.address, "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [p["place"] for p in doc["places"]] == ["x0", "x1", "x2"] and all(p["created"] for p in doc["places"])
        addr = parse_address(coordinator.address)
        with Coordinator(addr) as c:
            places = c.places()
        for i, s in enumerate(servers):
            p = places[f"x{i}"]
            assert p.tags == {"target": "local", "transport": "ssh", "label_lab_a": "1", f"label_slot{i}": "1"}, p.tags
            assert p.matches == (f"*/x{i}/NetworkService",) and f"127.0.0.1:{s.port}" in p.comment and not p.acquired
        # the resources: labgrid's own exporter, started by `--run-exporter` (the process becomes it)
        exporter = subprocess.Popen([str(Path(PY).with_name("edgekit")), "lab", "export", "--coordinator",
                                     coordinator.address, "--run-exporter", "--exporter-name", "ek-test"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = cli("lab", "places", "--coordinator", coordinator.address, "--json")
            rows = {p["place"]: p for p in json.loads(r.stdout)}
            if all(rows[f"x{i}"]["resources"] for i in range(3)):
                break
            time.sleep(0.3)
        for i, s in enumerate(servers):
            (res,) = rows[f"x{i}"]["resources"]
            assert res["path"] == f"ek-test/x{i}/NetworkService/NetworkService" and res["avail"], res
            assert res["params"] == {"address": "127.0.0.1", "port": s.port, "username": s.user}, res
        # acquiring a place (what a deploy does) acquires its resource on the exporter too
        monkeypatch.setenv("EDGEKIT_COORDINATOR", coordinator.address)
        with _session("x1", lock_wait=False):
            with Coordinator(addr) as c:
                assert c.places()["x1"].acquired_resources == ("ek-test/x1/NetworkService/NetworkService",)
                assert [x.acquired for x in c.resources() if x.path.startswith("ek-test/x1/")] == ["x1"]
        with Coordinator(addr) as c:
            assert not c.places()["x1"].acquired and not [x for x in c.resources() if x.acquired]
        # an update: a label removed, its tag goes; the place stays
        add_device(get_device("x0").model_copy(update={"labels": ["lab-A"]}), replace=True)
        r = cli("lab", "export", "x0", "--coordinator", coordinator.address)
        assert r.exit_code == 0 and "updated place x0" in r.stdout, r.stdout + r.stderr
        assert _place(coordinator, "x0").tags == {"target": "local", "transport": "ssh", "label_lab_a": "1"}
    finally:
        if exporter is not None:
            _stop(exporter)
        for s in servers:
            s.stop()


# --- contention ----------------------------------------------------------------------------------
CONTENDER = textwrap.dedent("""
    import sys, time
    from edgekit.devices.session import DeviceSession
    from edgekit.inputs.targets import load_target
    name, rounds, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    busy = ("import sys, time; f = open(sys.argv[1], 'a'); s = time.time(); time.sleep(0.2); "
            "f.write('%r %r\\\\n' % (s, time.time()))")
    waited = 0
    for i in range(rounds):
        with DeviceSession(load_target("local"), name, source_io=None, plan=None, lock_timeout=300) as s:
            waited += s.place.waited_s > 0.05
            r = s.transport.run([s.transport.python, "-c", busy, log], timeout=60)
            assert r.ok, r.stderr
    print("WAITED", waited, flush=True)
""")


def test_two_hosts_contend_through_the_coordinator_without_double_booking(lab, home, coordinator, tmp_path):
    name, _ = lab
    log = tmp_path / "device-busy.log"  # written on the device (the sshd side of the link)
    rounds = 6
    procs = []
    for h in ("host-a", "host-b"):
        shutil.copytree(home, tmp_path / h)
        procs.append(subprocess.Popen([PY, "-c", CONTENDER, name, str(rounds), str(log)], stdout=subprocess.PIPE,
                                      text=True, env=_env(EDGEKIT_HOME=str(tmp_path / h), EDGEKIT_DEVICE_LEASE="0")))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    n, double = overlaps(log)
    assert n == 2 * rounds and double == 0, (n, double)
    waits = sum(int(o.split()[-1]) for o in outs)
    assert waits >= 1, outs  # they really contended: some rounds queued behind the other host
    assert _place(coordinator, name).acquired is None


# --- refusal, listing, crash recovery ------------------------------------------------------------
def test_refusal_names_the_holder_and_devices_list_shows_it(lab, coordinator, cli):
    from edgekit.devices.coordinator import PlaceHeld

    name, _ = lab
    holder = _start_holder(name, EDGEKIT_DEVICE_LEASE="0")
    try:
        t0 = time.monotonic()
        with pytest.raises(PlaceHeld) as ei:
            with _session(name, lock_wait=False):
                pass
        assert time.monotonic() - t0 < 5
        msg = ei.value.message
        assert ei.value.exit_code == 3 and f"PID {holder.pid} on " in msg and coordinator.address in msg, msg
        assert "drop --no-wait" in ei.value.hint
        with pytest.raises(PlaceHeld, match="stayed reserved on the labgrid coordinator .* for 1 s"):
            with _session(name, lock_timeout=1.0):
                pass
        r = cli("devices", "list", "--json")
        assert r.exit_code == 0, r.stderr
        (row,) = [d for d in json.loads(r.stdout) if d["name"] == name]
        assert f":pid{holder.pid}:" in row["place"]["acquired"] and f"PID {holder.pid}" in row["place"]["holder"]
        r = cli("devices", "list")
        assert "labgrid place:" in r.stdout and str(holder.pid) in r.stdout, r.stdout  # (a table: words wrap)
    finally:
        _stop(holder)


def test_a_sigkilled_holders_place_is_taken_over_at_once_on_its_host(lab, coordinator):
    name, _ = lab
    holder = _start_holder(name, EDGEKIT_DEVICE_LEASE="0")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    # labgrid has no expiry: the coordinator still has the dead process as the holder
    assert f":pid{holder.pid}:" in _place(coordinator, name).acquired
    said = []
    t0 = time.monotonic()
    with _session(name, lock_wait=False, progress=said.append) as s:  # --no-wait: no waiting is needed
        assert s.place.took_over and f"PID {holder.pid} on this host) is gone" in s.place.took_over
        assert _place(coordinator, name).acquired == s.place.client.holder
    assert time.monotonic() - t0 < 10
    assert any("took over the labgrid place" in m for m in said), said
    assert _place(coordinator, name).acquired is None  # released on exit


def test_a_dead_holder_elsewhere_is_taken_over_after_its_ttl_a_live_one_never(lab, coordinator):
    from edgekit.devices.coordinator import PlaceHeld

    name, _ = lab
    lg = [PY, "-m", "labgrid.remote.client", "-x", coordinator.address, "-p", name]
    # an edgekit holder on another host (its name says so) that stopped renewing: it died there
    ghost = "ci-elsewhere:edgekit-0badc0ffee12:pid4242:ttl1.5:0000abcd"
    subprocess.run([*lg, "acquire", "--allow-unmatched"], check=True, capture_output=True,
                   env=_env(LG_HOSTNAME=ghost, LG_USERNAME="ci"))
    with pytest.raises(PlaceHeld, match=r"edgekit run 0badc0ffee12 \(PID 4242 on ci-elsewhere, user ci\)"):
        with _session(name, lock_wait=False):  # its PID cannot be checked from here: not at once
            pass
    with _session(name, lock_timeout=30) as s:
        assert "not renewed for" in s.place.took_over and 1.4 <= s.place.waited_s <= 15, s.place
    # a live holder with the same short TTL renews (every 0.5 s) and keeps its place for all of its 4 s
    holder = _start_holder(name, 4.0, EDGEKIT_DEVICE_LEASE="0", EDGEKIT_PLACE_TTL_S="1.5")
    try:
        with _session(name, lock_timeout=60) as s:
            got = time.time()
            assert s.place.took_over is None and s.place.waited_s >= 2.5, s.place
        released = float(holder.stdout.readline().split()[1])
        assert got >= released, (got, released)
    finally:
        _stop(holder)


def test_a_place_acquired_with_labgrid_client_is_never_taken_over(lab, coordinator):
    from edgekit.devices.coordinator import PlaceHeld

    name, _ = lab
    lg = [PY, "-m", "labgrid.remote.client", "-x", coordinator.address, "-p", name]
    env = _env(LG_HOSTNAME="bobs-laptop", LG_USERNAME="bob")
    subprocess.run([*lg, "acquire", "--allow-unmatched"], check=True, capture_output=True, env=env)
    with pytest.raises(PlaceHeld) as ei:
        with _session(name, lock_timeout=2.0):
            pass
    assert "bob on bobs-laptop (labgrid-client, not edgekit)" in ei.value.message, ei.value.message
    assert f"labgrid-client -x {coordinator.address} -p {name} release --kick" in ei.value.hint
    subprocess.run([*lg, "release", "--kick"], check=True, capture_output=True, env=_env())
    with _session(name, lock_wait=False) as s:
        assert s.place.took_over is None


def test_deploy_reserves_and_frees_the_place(lab, coordinator, tmp_path):
    from test_fleet import _mlp_onnx

    import edgekit
    from edgekit.inputs.recipe import Recipe

    name, _ = lab
    model, data = _mlp_onnx(tmp_path / "mlp.onnx", width=64, n=40)
    said = []
    r = edgekit.deploy(model, eval_data=data, target="local", device=name, recipe=Recipe(baseline="fp32", variants=[]),
                       out=tmp_path / "out", runs=5, min_seconds=0.0, warmup=1, lock_wait=False, progress=said.append)
    assert r.variants[0].latency_ms.p50 > 0
    assert any(f"reserved labgrid place '{name}' on {coordinator.address}" in m for m in said), said
    assert _place(coordinator, name).acquired is None


# --- errors --------------------------------------------------------------------------------------
def test_unreachable_coordinator_missing_place_and_missing_labgrid_say_what_to_do(lab, coordinator, monkeypatch,
                                                                                  cli):
    from edgekit.devices.coordinator import CoordinatorUnreachable
    from edgekit.errors import DeviceError
    from edgekit.sim.sshd import free_port

    name, _ = lab
    # a device that was never exported: no place
    add_device(get_device(name).model_copy(update={"name": name + "-new"}))
    with pytest.raises(DeviceError, match="has no place on the labgrid coordinator") as ei:
        with _session(name + "-new", lock_wait=False):
            pass
    assert ei.value.exit_code == 3
    assert f"edgekit lab export --coordinator {coordinator.address} {name}-new" in ei.value.hint

    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("EDGEKIT_COORDINATOR", dead)
    with pytest.raises(CoordinatorUnreachable) as ei:  # never a silent run without reservations
        with _session(name, lock_wait=False):
            pass
    assert ei.value.exit_code == 3 and dead in ei.value.message and "unset EDGEKIT_COORDINATOR" in ei.value.hint
    r = cli("devices", "list")
    assert r.exit_code == 3 and dead in r.stderr and "labgrid-coordinator --listen" in r.stderr, r.stderr
    monkeypatch.setenv("EDGEKIT_COORDINATOR", "not a/address")
    r = cli("devices", "list")
    assert r.exit_code == 2 and "is not a coordinator address HOST:PORT" in r.stderr, r.stderr
    monkeypatch.delenv("EDGEKIT_COORDINATOR")
    r = cli("lab", "export")
    assert r.exit_code == 2 and "pass --coordinator HOST:PORT or set EDGEKIT_COORDINATOR" in r.stderr, r.stderr

    # labgrid hidden from a real Python: the exact install hint (exit 2)
    code = textwrap.dedent("""
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "labgrid" or name.startswith("labgrid."):
                    raise ModuleNotFoundError("No module named 'labgrid'", name=name)
        sys.meta_path.insert(0, Hide())
        from edgekit.devices.coordinator import session_place
        try:
            session_place("pi-1", wait=False, timeout=None)
        except Exception as exc:
            print(exc.exit_code, exc)
    """)
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(EDGEKIT_COORDINATOR=dead),
                         timeout=60).stdout
    assert out.startswith("2 ") and "pip install 'edgekit[lab]'" in out and "labgrid" in out, out


# --- slow: two CI hosts in network namespaces, a pool of three devices in namespaces of their own ------------

# One CI host: ROUNDS `edgekit deploy --pool` runs one after the other; each must pass (every unit measured,
# no budget to fail), else the host stops with that deploy's output. Progress lines are kept for the test.
CI_HOST = textwrap.dedent("""
    import subprocess, sys
    edgekit, out, rounds, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    for i in range(rounds):
        r = subprocess.run([edgekit, "deploy", *args, "--out", f"{out}/round{i}"], capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            print(f"round {i}: exit {r.returncode}\\n{r.stdout[-3000:]}", flush=True)
            sys.exit(9)
""")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces, a bridge)")
def test_two_ci_hosts_in_namespaces_contend_for_a_pool_through_the_coordinator(tmp_path, monkeypatch):
    from test_fleet import _mlp_onnx

    from edgekit.sim import sshd as _sshd

    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "host-a"))
    monkeypatch.delenv("EDGEKIT_COORDINATOR", raising=False)
    net = LabNet()
    servers, coord = [], None
    try:
        coord = start_coordinator(tmp_path / "coordinator", host=net.host_addr)  # the lab server, on the bridge
        logs = {}
        for i in range(3):
            ns, addr = net.add(f"dev{i}")
            s = _sshd.start(_sshd.prepare(tmp_path / f"sshd{i}", host=addr, port=22), netns=ns)
            servers.append(s)
            name = f"unit-{i}"
            register(s, name, target="local", workdir=tmp_path / f"dev{i}")
            logs[name] = tmp_path / f"dev{i}-agent-runs.log"
            wrapper = tmp_path / f"dev{i}-python.py"
            wrapper.write_text(AGENT_LOGGER.format(py=PY, log=str(logs[name])))
            add_device(get_device(name).model_copy(update={"python": f"{PY} {wrapper}", "labels": ["lab"]}),
                       replace=True)
        hosts = [net.add(h)[0] for h in ("ci-a", "ci-b")]
        edgekit = str(Path(PY).with_name("edgekit"))
        # exported from inside CI host a's namespace: the coordinator is reached over the bridge
        r = subprocess.run(["ip", "netns", "exec", hosts[0], edgekit, "lab", "export", "--coordinator", coord.address],
                           capture_output=True, text=True, timeout=120, env=_env())
        assert r.returncode == 0, r.stderr
        shutil.copytree(tmp_path / "host-a", tmp_path / "host-b")  # host b: the same inventory, its own locks
        model, data = _mlp_onnx(tmp_path / "mlp.onnx", width=256, n=60)
        recipe = tmp_path / "fp32.yaml"
        recipe.write_text("baseline: fp32\nvariants: []\n")
        rounds = int(os.environ.get("EDGEKIT_CONTENTION_ROUNDS", "20"))
        args = [str(model), "--target", "local", "--pool", "local:lab", "--eval-data", str(data), "--recipe",
                str(recipe), "--runs", "5", "--min-seconds", "0", "--warmup", "1", "--lock-timeout", "900"]
        procs = []
        for ns, h in zip(hosts, ("host-a", "host-b")):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, PY, "-c", CI_HOST, edgekit, str(tmp_path / h / "out"), str(rounds), *args],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=_env(EDGEKIT_HOME=str(tmp_path / h), EDGEKIT_COORDINATOR=coord.address,
                         EDGEKIT_DEVICE_LEASE="0")))  # the coordinator alone keeps the two hosts apart
        outs = [p.communicate(timeout=3600) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[0] + o[1][-2000:] for o in outs]
        for name, log in logs.items():
            n, double = overlaps(log)
            assert n >= 2 * rounds and double == 0, (name, n, double)
        said = "".join(o[1] for o in outs)
        assert said.count("reserved labgrid place") == 2 * rounds * 3, said[-2000:]
        assert "(waited " in said  # the hosts really queued behind each other
        with_places = {p.name: p for p in _places_at(coord.address).values()}
        assert all(with_places[f"unit-{i}"].acquired is None for i in range(3))
    finally:
        for s in servers:
            s.stop()
        if coord is not None:
            coord.stop()
        net.close()


def _places_at(address: str):
    from edgekit.devices.coordinator import Coordinator, parse_address

    with Coordinator(parse_address(address)) as c:
        return c.places()


def test_addresses_holder_names_and_tags():
    from edgekit.devices.coordinator import describe_holder, holder_name, host_id, parse_address, parse_holder
    from edgekit.devices.inventory import DeviceEntry
    from edgekit.errors import BadInputError
    from edgekit.lab.export import exporter_config, place_match, place_tags

    assert str(parse_address("lab-server")) == "lab-server:20408"
    assert str(parse_address(" 10.0.0.2:1234 ")) == "10.0.0.2:1234"
    assert str(parse_address("[::1]:5")) == "[::1]:5"
    for bad in ("", "http://x:1", "a b", "x:notaport"):
        with pytest.raises(BadInputError, match="is not a coordinator address"):
            parse_address(bad)
    me = holder_name(30)
    h = parse_holder(me)
    assert h.pid == os.getpid() and h.ttl_s == 30 and h.host_id == host_id() and me.count("/") == 1
    assert parse_holder("laptop/bob") is None and "bob on laptop (labgrid-client" in describe_holder("laptop/bob")
    e = DeviceEntry(name="pi-1", target="jetson-orin-nano", host="10.0.0.5", user="pi", labels=["Lab-A", "heat.sink"])
    assert place_tags(e) == {"target": "jetson_orin_nano", "transport": "ssh", "label_lab_a": "1",
                             "label_heat_sink": "1"}
    assert place_match(e) == "*/pi-1/NetworkService"
    a = DeviceEntry(name="px", kind="adb", target="pixel-arm64", serial="0123ABC")
    assert exporter_config([e, a]) == {"pi-1": {"NetworkService": {"address": "10.0.0.5", "port": 22,
                                                                   "username": "pi"}},
                                       "px": {"EdgekitADBDevice": {"serial": "0123ABC"}}}


@pytest.mark.slow
def test_a_restarted_coordinator_forgets_acquisitions_and_the_holder_takes_its_place_again(tmp_path, caplog):
    """labgrid's coordinator reloads its places from places.yaml (written every 15 s) without their holders;
    the renewing holder notices (AllowPlace refused, the place free) and acquires it again."""
    import logging

    from edgekit.devices.coordinator import Coordinator, PlaceReservation, parse_address

    caplog.set_level(logging.WARNING, logger="edgekit.lab")
    again = "device p1: acquired the labgrid place again (the coordinator had forgotten it)"
    c = start_coordinator(tmp_path / "coordinator")
    try:
        addr = parse_address(c.address)
        with Coordinator(addr) as k:
            k.rpc("AddPlace", name="p1")
        saved = tmp_path / "coordinator" / "places.yaml"
        deadline = time.monotonic() + 40
        while not (saved.is_file() and "p1" in saved.read_text()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "p1" in saved.read_text()  # what the restarted coordinator reloads
        r = PlaceReservation("p1", addr, ttl_s=1.5).acquire(wait=False)
        holder = r.client.holder
        assert not [m for m in caplog.messages if "acquired the labgrid place again" in m]
        old = c
        c.stop()
        assert old.proc.poll() is not None  # the first coordinator is gone, not just unreachable for a while
        c = start_coordinator(tmp_path / "coordinator", port=addr.port)
        assert c.proc.pid != old.proc.pid  # a new process on the same address
        # the renewal path that re-acquires a forgotten place ran (it logs only when AllowPlace was refused
        # AND the reloaded place had no holder): the restart really forgot the acquisition
        deadline = time.monotonic() + 30
        while again not in caplog.messages and r.lost is None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert again in caplog.messages, (caplog.messages, r.lost, r.last_error)
        with Coordinator(addr) as k:
            assert k.places()["p1"].acquired == holder and r.lost is None
        assert r.release() is None
        with Coordinator(addr) as k:
            assert k.places()["p1"].acquired is None
    finally:
        c.stop()
