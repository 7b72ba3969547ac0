"""The closed loop end to end on `local`, with the real agent subprocess and real onnxruntime."""

import json

import numpy as np

from edgekit.report.model import Report


def test_deploy_digits_local_passes(cli, digits, tmp_path):
    """The first thing a user types, no recipe: a short search over the target's likeliest winners
    names the file to ship, proved faster or said not to be, and why every other candidate lost."""
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--calib-data", digits.calib,
            "--out", out, "--runs", "20", "--min-seconds", "0.1", "--warmup", "2")
    assert r.exit_code == 0, r.stderr
    rep = Report.load(out / "report.json")
    assert rep.search.mode == "quick" and rep.variants[0].name == "fp32"
    cands = {c.name: c for c in rep.search.candidates}
    # the likeliest winners were tried; the encodings measured slower than fp32 here are left to --search
    assert {"ort-int8-qdq-u8s8", "ort-int8-mixed", "tflite-fp32", "tflite-int8"} <= set(cands)
    assert cands["ort-int8-qdq-s8s8"].status == "skipped" and "--search" in cands["ort-int8-qdq-s8s8"].reason
    d = rep.decision
    assert d.ship == rep.search.selected and d.ship is not None
    # every candidate that lost has its line; the runtime settings that ran share one
    assert set(d.lost) - {"other runtime settings"} == {
        c.name for c in rep.search.candidates if c.status not in ("skipped", "baseline")
        and c.name not in (d.ship, d.ship.split("@")[0]) and ("@" not in c.name or c.status == "dropped")}
    tuned = [v.name for v in rep.variants if "@" in v.name and v.name != d.ship]
    assert all(n in d.lost["other runtime settings"] for n in tuned)
    ship, base = rep.variant(d.ship), rep.variant("fp32")
    if d.proved_faster:  # claimed only when the device's 95% CIs separate
        assert ship.latency_ms.ci95[1] < base.latency_ms.ci95[0] and "faster than fp32" in d.reason
    else:
        assert "faster than fp32 on the device" not in d.reason
    assert (out / "ship" / "ship.json").is_file() and f"ship: {d.reason}"[:40] in r.stdout.replace("\n", " ")
    # the shipped file run from ship/ alone, as a user's application would, scores what the report says
    r = cli("run", out / "ship", "--input", digits.eval, "--out", tmp_path / "y.npz")
    assert r.exit_code == 0, r.stderr
    with np.load(tmp_path / "y.npz") as y, np.load(digits.eval) as ev:
        top1 = 100.0 * float((next(iter(y.values())).argmax(1) == ev["y"]).mean())
    assert abs(top1 - ship.accuracy.value) < 1e-3, (top1, ship.accuracy.value)
    fp32 = rep.variants[0]
    assert fp32.accuracy.value > 90 and fp32.accuracy.n == 360 and fp32.latency_ms.runs >= 20
    assert fp32.parity.top1_agreement == 1.0 and fp32.parity.max_abs_err < 1e-3
    assert rep.gate.passed and (out / "report.md").read_text().startswith("# edgekit report")
    assert json.loads((out / "report.json").read_text())["schema_version"].startswith("1.")


def test_deploy_no_search_measures_the_fixed_default_variants(cli, digits, tmp_path):
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--calib-data", digits.calib,
            "--out", out, "--runs", "20", "--min-seconds", "0.1", "--warmup", "2", "--no-search")
    assert r.exit_code == 0, r.stderr
    rep = Report.load(out / "report.json")
    assert [v.name for v in rep.variants] == ["fp32", "int8-static"] and rep.search is None
    fp32, int8 = rep.variants
    assert fp32.accuracy.value > 90 and int8.accuracy.n == 360
    assert int8.latency_ms.runs >= 20 and int8.latency_ms.p50 > 0
    # the decision's rule (report/decision.py) on what was measured: among the variants that pass the gate's
    # checks alone, the fastest p50, and among those tied with it (the one tie rule: the CI of their p50 ratio
    # reaches into 1 +- TIE_TOLERANCE), the smallest file
    from edgekit.report.decision import p50_ratio, speed_tied

    ok = [v for v in rep.variants if not rep.decision.lost.get(v.name, "").startswith("fails")]
    assert ok, rep.decision
    fastest = min(ok, key=lambda v: (v.latency_ms.p50, v.name))
    tied = [v for v in ok if v is fastest or speed_tied(p50_ratio(fastest, v).ci95)]
    want = min(tied, key=lambda v: (v.size_bytes, v.name))
    assert rep.decision.ship == want.name, (rep.decision, [(v.name, v.latency_ms.ci95, v.size_bytes) for v in ok])
    assert set(rep.decision.lost) == {"fp32", "int8-static"} - {want.name}, rep.decision  # the other says why


def test_search_steering_options_without_a_search_are_refused(cli, digits, tmp_path):
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--out", tmp_path, "--no-search", "--objective", "p99")
    assert r.exit_code == 2 and "--objective and --time-budget steer a search" in r.stderr
    assert not (tmp_path / "report.json").exists()
