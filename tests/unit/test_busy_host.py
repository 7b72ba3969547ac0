"""A busy host (issue #22): host-side threads sized to the free CPU, a time budget that bounds the wall
clock (a running build is stopped and dropped with its time; the lock wait is outside the budget), the
local target locked like any device, and a timeline that accounts for the run's wall time.

Real processes throughout: CPU hogs are bounded busy loops this module starts and stops, the second deploy
is a real `edgekit` process, and the lock is the real flock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest
from conftest import run_edgekit_subprocess
from test_search import _NoConfig

from edgekit.agent.host import HostThreads, host_compute, host_threads
from edgekit.errors import BadInputError
from edgekit.inputs.recipe import PassStep, VariantSpec
from edgekit.inputs.targets import MeasureDefaults
from edgekit.passes.base import Pass, PassOutput
from edgekit.passes.registry import register
from edgekit.timeline import Clock, check_deadline, timeline_line
from edgekit.variant_search import SearchOptions, search

MEASURE = MeasureDefaults(warmup=1, runs=5, min_seconds=0, max_runs=5, threads=1)
STATIC = VariantSpec(name="int8", passes=[PassStep(name="quantize", config={"mode": "static"})])


def _agent():
    from edgekit.agent.inprocess import load_agent

    return load_agent()


# --- the CPU the host may use --------------------------------------------------------------------------
def _fake_root(tmp_path: Path, *, cgroup: str, files: dict[str, str], running: int) -> Path:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/stat").write_text(f"cpu  1 2 3 4\nprocs_running {running}\nprocs_blocked 0\n")
    for rel, text in files.items():
        p = root / "sys/fs/cgroup" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_cgroup_v1_quota_caps_usable_cores(tmp_path):
    root = _fake_root(tmp_path, cgroup="4:cpu,cpuacct:/board\n", running=1,
                      files={"cpu/board/cpu.cfs_quota_us": "25000", "cpu/board/cpu.cfs_period_us": "100000",
                             "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    b = _agent().device.cpu_budget(str(root), samples=1)
    assert b["quota_cores"] == pytest.approx(0.25)
    assert b["usable_cores"] == pytest.approx(min(len(os.sched_getaffinity(0)), 0.25))
    assert b["threads"] == 1  # a quarter of a core is one thread, never zero


def test_cgroup_v2_quota_and_run_queue(tmp_path):
    n = len(os.sched_getaffinity(0))
    root = _fake_root(tmp_path, cgroup="0::/ci/job\n", running=3,
                      files={"cgroup.controllers": "cpu", "ci/job/cpu.max": "150000 100000", "ci/cpu.max": "max 100000"})
    b = _agent().device.cpu_budget(str(root), samples=3, interval=0)
    assert b["quota_cores"] == pytest.approx(1.5)
    assert b["others_running"] == 2  # procs_running less this process
    assert b["usable_cores"] == pytest.approx(min(n, 1.5))
    assert b["free_cores"] == pytest.approx(max(0.0, min(n, 1.5) - 2))
    assert b["threads"] == 1


def test_quiet_fake_host_gets_every_usable_core(tmp_path):
    n = len(os.sched_getaffinity(0))
    root = _fake_root(tmp_path, cgroup="0::/\n", running=1, files={"cgroup.controllers": "cpu"})
    b = _agent().device.cpu_budget(str(root), samples=1)
    assert b["quota_cores"] is None and b["others_running"] == 0 and b["threads"] == n


def test_override_by_option_and_environment(monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOST_THREADS", "3")
    ht = host_threads()
    assert (ht.threads, ht.source) == (3, "EDGEKIT_HOST_THREADS")
    ht = host_threads(1)
    assert (ht.threads, ht.source) == (1, "--host-threads")
    assert "1 thread (--host-threads)" in ht.describe()
    monkeypatch.setenv("EDGEKIT_HOST_THREADS", "many")
    with pytest.raises(BadInputError, match="EDGEKIT_HOST_THREADS must be a whole number"):
        host_threads()
    with pytest.raises(BadInputError, match="--host-threads"):
        host_threads(0)


def test_host_compute_sets_and_restores_torch_and_tensorflow_threads():
    import torch

    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with host_compute(HostThreads(target, "--host-threads", {})):
        assert torch.get_num_threads() == target
        assert os.environ["TF_NUM_INTRAOP_THREADS"] == str(target)
    assert torch.get_num_threads() == before
    assert os.environ.get("TF_NUM_INTRAOP_THREADS") != str(target) or before == target


def _hog_code(seconds: float) -> str:
    return f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def hogs():
    """Start n bounded CPU hogs (busy loops that end by themselves); killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(n: int, seconds: float = 30.0):
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", _hog_code(seconds)]))
        time.sleep(0.5)  # let them reach the run queue
        return procs

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_a_host_with_every_core_busy_gets_one_thread(hogs):
    n = len(os.sched_getaffinity(0))
    hogs(n)
    ht = host_threads()
    assert ht.cpu["others_running"] >= n - 1, ht.cpu  # the hogs are seen in the run queue
    assert ht.threads == 1, ht.describe()
    assert ht.busy() and "other runnable" in ht.describe()


# --- the time budget bounds the wall clock ------------------------------------------------------------
class CooperativeSlowBuild(Pass):
    """A build that would run for a minute; like the long passes it checks the deadline between steps."""

    name = "cooperative_slow_build"
    Config = _NoConfig
    from edgekit.formats import Format as _F

    input_formats = (_F.ONNX,)

    def run(self, artifact, config, ctx, stem):
        end = time.perf_counter() + 60
        step = 0
        while time.perf_counter() < end:
            step += 1
            check_deadline(f"step {step}")
            time.sleep(0.05)
        m = onnx.load(str(artifact.path))
        out = ctx.workdir / f"{stem}.onnx"
        onnx.save(m, out)
        return PassOutput(path=out, precision="fp32")


@pytest.fixture(scope="module")
def digits_onnx(digits, tmp_path_factory):
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source

    d = tmp_path_factory.mktemp("digits-onnx-busy")
    src = load_source(digits.pt2, workdir=d)
    return export_onnx(src, d / "digits.onnx", list(load_npz(digits.eval).xs)).path


def _cands(rep) -> dict[str, dict]:
    return {c["name"]: c for c in rep.search.model_dump()["candidates"]}


def test_a_build_past_the_budget_is_stopped_and_dropped_with_its_time(digits_onnx, digits, tmp_path):
    from edgekit.variant_search.run import BUILD_SHARE

    register("cooperative_slow_build", f"{__name__}:CooperativeSlowBuild")
    budget = 12.0
    slow = VariantSpec(name="slow-build", passes=[PassStep(name="cooperative_slow_build")])
    started = time.perf_counter()
    rep = search(digits_onnx, eval_data=digits.eval, calib_data=digits.calib, target="local", out=tmp_path,
                 max_accuracy_drop=1.0, options=SearchOptions(candidates=[slow, STATIC], time_budget_s=budget,
                                                              measure=MEASURE, screening_runs=5, host_filter=False))
    wall = time.perf_counter() - started
    c = _cands(rep)
    assert c["slow-build"]["status"] == "dropped" and c["slow-build"]["dropped_at"] == "build", c["slow-build"]
    assert c["slow-build"]["reason"].startswith("cut by the time budget"), c["slow-build"]["reason"]
    assert "stopped by the time budget after" in c["slow-build"]["reason"]
    # stopped at the build share of the budget, not after its 60 s
    assert c["slow-build"]["build_seconds"] < BUILD_SHARE * budget + 1.0, c["slow-build"]
    assert c["int8"]["dropped_at"] == "build" and "time budget exhausted before" in c["int8"]["reason"]
    assert wall < 45, wall  # the run ends near its budget (measuring fp32 and tuning stop at the deadline)
    assert any("not built or cut by the time budget (slow-build, int8)" in w for w in rep.warnings), rep.warnings
    tl = rep.search.timeline
    builds = [s for s in tl.spans if s.stage == "build"]
    assert [s.name for s in builds] == ["slow-build"]  # int8 was never started
    assert builds[0].seconds == pytest.approx(c["slow-build"]["build_seconds"], abs=0.5)


def test_timeline_accounts_for_the_wall_time(digits_onnx, digits, tmp_path):
    rep = search(digits_onnx, eval_data=digits.eval, calib_data=digits.calib, target="local", out=tmp_path,
                 max_accuracy_drop=1.0, options=SearchOptions(candidates=[STATIC], time_budget_s=120,
                                                              measure=MEASURE, screening_runs=5))
    tl = rep.search.timeline
    stages = {s.stage for s in tl.spans}
    assert {"preparation", "build", "host_filter", "lock_wait", "connect", "screening", "finals", "tuning"} <= stages
    covered = sum(s.seconds for s in tl.spans if s.stage != "report")
    assert tl.unattributed_s <= 0.05 * tl.wall_s, (tl.unattributed_s, tl.wall_s)
    assert covered == pytest.approx(tl.wall_s, rel=0.06)
    assert rep.search.host["threads"] >= 1 and "thread" in rep.search.host["summary"]
    assert rep.settings["host"]["threads"] == rep.search.host["threads"]
    line = timeline_line(tl)
    assert line.startswith("time: ") and "of a 120 s budget" in line and "builds" in line
    html = (tmp_path / "report.html").read_text()
    assert "id=search-timeline" in html and "preparation" in html
    assert "time: " in (tmp_path / "report.md").read_text()


def test_a_search_that_waited_for_the_lock_still_runs_finals_and_tuning(digits_onnx, digits, tmp_path):
    """The local target is locked like any device; the wait is reported and outside the budget."""
    from edgekit.devices.lock import DeviceLock
    from edgekit.devices.session import LOCAL_LOCK

    hold = 10.0
    held = threading.Event()

    def holder():
        with DeviceLock(LOCAL_LOCK):
            held.set()
            time.sleep(hold)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    try:
        # the budget: ample for preparation and the build, not for them plus the lock wait
        rep = search(digits_onnx, eval_data=digits.eval, calib_data=digits.calib, target="local", out=tmp_path,
                     max_accuracy_drop=1.0, options=SearchOptions(candidates=[STATIC], time_budget_s=14,
                                                                  measure=MEASURE, screening_runs=5))
    finally:
        t.join()
    tl = rep.search.timeline
    assert tl.lock_wait_s >= 3.0, tl  # it did wait for the holder
    c = _cands(rep)
    assert c["int8"]["status"] in ("selected", "finalist") or c["int8"]["dropped_at"] in ("racing", "finals"), c
    tuned = [x for x in c.values() if "@" in x["name"]]
    assert tuned, c
    assert not [x for x in tuned if x["dropped_at"] == "tuning" and "time budget exhausted" in (x["reason"] or "")], \
        tuned  # the wait did not eat the tuning's share
    assert any(s.stage == "tuning" and s.seconds > 0 for s in tl.spans)


@pytest.mark.slow  # two full deploys side by side (~65 s)
def test_two_deploys_to_local_do_not_measure_at_once(digits, tmp_path):
    """Two real `edgekit deploy --target local` processes: the second waits for the first's lock, so their
    device sections (connect to the end of profiling) never overlap."""
    args = ["deploy", str(digits.pt2), "--target", "local", "--eval-data", str(digits.eval), "--calib-data",
            str(digits.calib), "--runs", "20", "--min-seconds", "0", "--time-budget", "120", "--json"]
    exe = Path(sys.executable).with_name("edgekit")
    procs = [subprocess.Popen([str(exe), *args, "--out", str(tmp_path / f"out{i}")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode in (0, 1), err[-2000:]
    import json

    windows = []
    for i in range(2):
        doc = json.loads((tmp_path / f"out{i}" / "report.json").read_text())
        tl = doc["search"]["timeline"]
        device = [s for s in tl["spans"] if s["stage"] in ("connect", "delivery", "screening", "finals", "tuning",
                                                           "profile")]
        start = tl["started_unix"] + min(s["start_s"] for s in device)
        end = tl["started_unix"] + max(s["start_s"] + s["seconds"] for s in device)
        windows.append((start, end, tl["lock_wait_s"]))
    (a0, a1, _), (b0, b1, _) = sorted(windows)
    assert a1 <= b0 + 0.05, windows  # the later one's device section starts after the earlier one's ends
    assert max(w[2] for w in windows) > 0.5, windows  # and one of them did wait for the lock


def test_clock_excludes_the_lock_wait_from_the_budget():
    c = Clock(budget_s=10.0)
    d0 = c.deadline
    now = time.perf_counter()
    c.add_span("lock_wait", now, now + 4.0, excluded=True)
    assert c.deadline == pytest.approx(d0 + 4.0)
    assert c.share_deadline(0.5) == pytest.approx(c.started + 5.0 + 4.0)
    with c.deadline_scope(time.perf_counter() - 1, "the build of x"):
        with pytest.raises(Exception, match="the build of x stopped by the time budget after .* \\(at trial 3\\)"):
            check_deadline("trial 3")
    check_deadline("outside any scope")  # no active deadline: nothing happens


def test_a_figure_measured_on_a_busy_device_says_so():
    from report_factory import variant

    from edgekit.report.decision import busy_note, ship_decision

    quiet, busy = variant("fp32", median=2.0), variant("int8", median=1.0, seed=1)
    busy.device_state = {"other_cpu_fraction": 0.48}
    assert busy_note(quiet) == ""
    d = ship_decision(busy, quiet, {})
    assert "faster than fp32" in d.reason
    assert "measured on a busy device: other processes used int8 48% of its CPU" in d.reason, d.reason
    assert "busy device" not in ship_decision(variant("int8", median=1.0, seed=1), quiet, {}).reason


def test_progress_in_a_log_says_still_while_a_step_runs_long(capsys):
    from edgekit.cli.common import progress_display

    with progress_display(still_every_s=1.0) as say:
        say("building candidate int8")
        time.sleep(2.6)
    err = capsys.readouterr().err
    assert "edgekit: building candidate int8 ..." in err
    assert "edgekit: still building candidate int8 (" in err, err


def test_calibration_session_uses_the_host_threads(tmp_path):
    """onnxruntime's calibrator opens a session with a thread per core; edgekit reopens it sized to the host."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from edgekit.passes.quantize_ort import _size_session
    from tests.unit.agent_loader import tiny_onnx

    model = tiny_onnx(tmp_path / "tiny.onnx")
    cal = create_calibrator(model, ["MatMul", "Gemm"], augmented_model_path=str(tmp_path / "aug.onnx"),
                            calibrate_method=CalibrationMethod.MinMax)
    for n in (1, 2):
        with host_compute(HostThreads(n, "--host-threads", {})):
            _size_session(cal)
        so = cal.infer_session.get_session_options()
        assert so.intra_op_num_threads == n


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/cpu"),
                    reason="needs root and a cgroup v1 cpu hierarchy (CI has both) to hold a process to 25% of a core")
def test_a_real_cgroup_quota_is_read_by_the_agent():
    """A process held to 25% of a core by a real cgroup v1 quota (as `edgekit sim` boards are) sees 0.25
    usable cores and one thread, whatever os.cpu_count() says."""
    import json

    cg = Path(f"/sys/fs/cgroup/cpu/edgekit-test-{os.getpid()}")
    cg.mkdir()
    try:
        (cg / "cpu.cfs_quota_us").write_text("25000")
        code = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); from edgekit_agent import device; "
                "print(json.dumps(device.cpu_budget()))")
        from edgekit.agent.package import agent_pyz

        agent_dir = str(agent_pyz())
        out = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$0" -c "$1" "$2"', sys.executable,
                              code, agent_dir], capture_output=True, text=True, timeout=60, check=True).stdout
        b = json.loads(out)
        assert b["quota_cores"] == pytest.approx(0.25) and b["usable_cores"] == pytest.approx(0.25), b
        assert b["threads"] == 1
    finally:
        cg.rmdir()


def test_the_report_records_the_threads_used_not_the_free_cpu():
    ht = HostThreads(1, "--host-threads", {"threads": 2, "usable_cores": 2.0, "others_running": 0, "load1": 0.2})
    d = ht.to_dict()
    assert d["threads"] == 1 and d["free_cpu_threads"] == 2 and d["source"] == "--host-threads"
    assert d["summary"] == "host: 2 cores, load 0.2, 0 other runnable, 1 thread (--host-threads)"
