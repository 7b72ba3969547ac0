"""Issue #45 item 2: a file's decode speed predicted before it is built, from the bytes a decode step reads and each
row's effective bandwidth (the benchmark's priors, then this device's quiet history), calibrated on a measured
leader."""

from __future__ import annotations

import pytest

from edgekit.llm import efficiency
from edgekit.llm.predict import PRIOR_GBPS, Weights, bytes_per_token, predict

# the benchmark's Llama 125M (docs/benchmarks/language-models.md): 12 layers of width 768, MLP 2048, 4 KV heads
LLAMA_125M = Weights(body=12 * (768 * 768 * 2 + 768 * 256 * 2 + 3 * 768 * 2048), head=32000 * 768, embed_width=768,
                     kv_per_position=2 * 12 * 4 * 64)
TABLE = {"ort-fp32": 47.0, "ort-int8": 127.3, "ort-int4": 139.1, "et-8da4w": 75.3, "gguf-q8_0": 180.0,
         "gguf-q4_0": 250.3, "gguf-q4_k_m": 189.6}


def test_bytes_a_token_follow_the_encoding():
    w = LLAMA_125M
    fp32, q4 = bytes_per_token(w, "ort-fp32"), bytes_per_token(w, "gguf-q4_0")
    # fp32 reads 4 B a weight of the body and head, one embedding row, and the cache (fp32) at 32 positions
    assert fp32 == pytest.approx(4 * (w.body + w.head) + 4 * 768 + 4 * w.kv_per_position * 32)
    assert 0.14 < q4 / fp32 < 0.2  # 4.5 bits a body weight, Q6_K head
    assert bytes_per_token(w, "ort-int4-b128") < bytes_per_token(w, "ort-int4") < bytes_per_token(w, "ort-int8")


def test_priors_reproduce_the_benchmark_table_and_calibration_carries_the_ratio():
    for name, measured in TABLE.items():  # on the benchmark's own model the prior is its own row
        assert predict(LLAMA_125M, name).tokens_per_s == pytest.approx(measured, rel=0.01)
    # calibrated on gguf-q4_0 measured at half the benchmark's speed: every other row at half its speed too
    for name, measured in TABLE.items():
        p = predict(LLAMA_125M, name, leader=("gguf-q4_0", 125.15))
        assert p.tokens_per_s == pytest.approx(measured / 2, rel=0.01)
        if name != "gguf-q4_0":
            assert p.spread == 1.5 and "calibrated on gguf-q4_0" in p.basis
    assert set(PRIOR_GBPS) >= set(TABLE)


def test_history_is_per_device_quiet_only_and_narrows_the_spread(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path))
    monkeypatch.delenv("EDGEKIT_NO_CACHE", raising=False)
    key = efficiency.device_key("local", {"device": {"hostname": "h", "cpu": "EPYC", "cores": 2}})
    assert key != efficiency.device_key("local", {"device": {"hostname": "h2", "cpu": "EPYC", "cores": 2}})
    assert not efficiency.record(key, "ort-int4", "1.20", 9.0, {"other_cpu_fraction": 0.5})  # busy: not kept
    assert efficiency.history(key) == {}
    assert efficiency.record(key, "ort-int4", "1.20", 9.0, {"other_cpu_fraction": 0.01})
    assert efficiency.history(key) == {"ort-int4": (9.0, efficiency.ONE_FIGURE_SPREAD)}
    for g in (9.5, 10.0):
        efficiency.record(key, "ort-int4", "1.20", g, {})
    med, spread = efficiency.history(key)["ort-int4"]
    assert med == 9.5 and spread == pytest.approx(max(efficiency.MIN_SPREAD, 9.5 / 9.0))
    p = predict(LLAMA_125M, "ort-int4", history=efficiency.history(key))
    assert p.spread == spread and "this device's history" in p.basis
    monkeypatch.setenv("EDGEKIT_NO_CACHE", "1")
    assert efficiency.history(key) == {}


def test_calibration_takes_both_efficiencies_from_one_source():
    """The leader's own history must not meet another row's prior: the ratio comes from the benchmark's priors
    unless the device has both rows' figures."""
    hist = {"ort-fp32": (1.4, 1.25)}  # a tiny model's figure: far below the 125M model's prior
    p = predict(LLAMA_125M, "ort-int8", history=hist, leader=("ort-fp32", 47.0))
    assert p.tokens_per_s == pytest.approx(127.3, rel=0.01) and "the benchmark prior" in p.basis
    both = {**hist, "ort-int8": (2.8, 1.2)}
    q = predict(LLAMA_125M, "ort-int8", history=both, leader=("ort-fp32", 47.0))
    ratio = bytes_per_token(LLAMA_125M, "ort-fp32") / bytes_per_token(LLAMA_125M, "ort-int8")
    assert q.tokens_per_s == pytest.approx(47.0 * ratio * 2.0) and q.spread == 1.25 and "history" in q.basis


def test_the_priors_predict_another_host_within_20_percent_for_most_rows():
    """The benchmark's Xeon --search table (docs/benchmarks/language-models.md, edgekit 422d8ac) predicted from the
    EPYC's priors, calibrated on the Xeon's measured leader: the figure the language-model guide states."""
    xeon = {"ort-fp32": 32.5, "ort-int8": 81.4, "ort-int4": 99.7, "et-fp32": 22.3, "et-8da8w": 46.5, "et-8da4w": 49.3,
            "et-8da4w-g64": 57.0, "et-int8": 1.9, "gguf-q8_0": 66.3, "gguf-q4_0": 103.1, "gguf-q4_k_m": 135.0}
    errors = sorted(abs(m / predict(LLAMA_125M, n, leader=("gguf-q4_k_m", 135.0)).tokens_per_s - 1)
                    for n, m in xeon.items() if n != "gguf-q4_k_m")
    assert errors[len(errors) // 2] == pytest.approx(0.13, abs=0.01) and sum(e <= 0.2 for e in errors) == 7
    # the slow lowering there (et-8da4w, 49.3 tok/s) could not have beaten the leader: it would not be built
    assert predict(LLAMA_125M, "et-8da4w", leader=("gguf-q4_k_m", 135.0)).optimistic < 135.0


def test_measured_files_make_the_next_prediction_this_devices_own(tmp_path, monkeypatch):
    """race.record_measured keeps each quiet measured file's effective bandwidth; the next run's predictions (and
    its calibration, once both rows have history) come from them."""
    from types import SimpleNamespace

    from edgekit.llm.race import record_measured

    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path))
    monkeypatch.delenv("EDGEKIT_NO_CACHE", raising=False)

    def v(name, decode, busy=0.0):
        return SimpleNamespace(name=name, generation=SimpleNamespace(decode_tokens_per_s=decode),
                               runtime=SimpleNamespace(version="1", threads=1),
                               device_state={"other_cpu_fraction": busy})

    doc = {"device": {"hostname": "board", "cpu": "A76", "cores": 4}}
    runs = [v("ort-fp32", 30.0), v("ort-int8", 90.0), v("ort-int8@t2", 150.0), v("gguf-q4_0", 200.0, busy=0.5)]
    assert record_measured(runs, doc, "pi", LLAMA_125M) == 2  # not the thread row, not the busy one
    hist = efficiency.history(efficiency.device_key("pi", doc))
    assert set(hist) == {"ort-fp32", "ort-int8"}
    p = predict(LLAMA_125M, "ort-int8", history=hist, leader=("ort-fp32", 30.0))
    assert p.tokens_per_s == pytest.approx(90.0, rel=1e-3) and "this device's history" in p.basis
    # a figure at other threads is not this setting's
    record_measured([v("ort-int8", 150.0)], doc, "pi", LLAMA_125M)
    efficiency.record(efficiency.device_key("pi", doc), "ort-fp32", "1", 99.0, {}, threads=4)
    at1 = efficiency.history(efficiency.device_key("pi", doc), threads=1)
    assert at1["ort-fp32"][0] == pytest.approx(30.0 * bytes_per_token(LLAMA_125M, "ort-fp32") / 1e9, rel=1e-3)


def test_a_rows_build_time_is_predicted_from_this_hosts_builds_of_a_model_that_size(tmp_path, monkeypatch):
    from edgekit.llm import build_times
    from edgekit.llm.candidates import CANDIDATES
    from edgekit.llm.race import BUILD_S_PER_MPARAM, build_seconds

    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path))
    monkeypatch.delenv("EDGEKIT_NO_CACHE", raising=False)
    et = next(c for c in CANDIDATES if c.name == "et-8da4w")
    assert build_seconds(et, 135_000_000) == pytest.approx(1 + BUILD_S_PER_MPARAM["slow"] * 135)  # the prior
    build_times.record("et-8da4w", 1300.0, 130_000_000)
    build_times.record("et-8da4w", 900.0, 130_000_000)
    build_times.record("et-8da4w", 30.0, 100_000)  # a tiny model's build: mostly fixed cost, another size
    assert build_seconds(et, 135_000_000) == pytest.approx(1300.0 * 135 / 130)  # the slowest of that size
    assert build_seconds(et, 100_000) == pytest.approx(30.0)
    assert build_seconds(et, 1_000_000_000) == pytest.approx(1 + BUILD_S_PER_MPARAM["slow"] * 1000)  # none kept
