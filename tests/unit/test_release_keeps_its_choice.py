"""A re-deploy against a release (--baseline) keeps the release's shipped variant while it stays within the
release's latency tolerance of the fastest finalist (variant_search/choice.keep_release_choice): near-tied files
would otherwise flip between releases on noise, and each flip fails the size check against an unchanged model
(seen in CI: a 54 KB INT8 file, then a 189 KB fp32 one, ~25 us each)."""

from __future__ import annotations

from report_factory import variant as make_variant

from edgekit.variant_search.choice import choose, keep_release_choice


def _finalist(name, p50, size, p99=None):
    v = make_variant(name, size=size)
    return v.model_copy(update={"latency_ms": v.latency_ms.model_copy(
        update={"p50": p50, "p99": p99 or 1.2 * p50, "ci95": [0.99 * p50, 1.01 * p50]})})


FP32, INT8, DYN = _finalist("fp32", 1.0, 200_000), _finalist("tflite-int8", 0.50, 50_000), \
    _finalist("tflite-dynamic", 0.54, 60_000)


def test_the_release_s_file_stays_inside_the_tolerance():
    chosen = choose([FP32, INT8, DYN], "p50")
    assert chosen.name == "tflite-int8"  # CIs separate: the fastest wins without a release
    kept, why = keep_release_choice(chosen, [FP32, INT8, DYN], "tflite-dynamic", "p50", 0.10)
    assert kept.name == "tflite-dynamic"
    assert why == {"variant": "tflite-dynamic", "released": "tflite-dynamic", "instead_of": "tflite-int8",
                   "fastest": "tflite-int8", "objective": "p50", "ratio_to_fastest": 1.08, "tolerance": 0.10}


def test_a_tuned_release_name_counts_as_its_file():
    kept, why = keep_release_choice(INT8, [FP32, INT8, DYN], "tflite-dynamic@t2", "p50", 0.10)
    assert kept.name == "tflite-dynamic" and why["released"] == "tflite-dynamic@t2"


def test_outside_the_tolerance_the_faster_file_ships():
    kept, why = keep_release_choice(INT8, [FP32, INT8, DYN], "tflite-dynamic", "p50", 0.05)  # 1.08x > 1.05
    assert kept.name == "tflite-int8" and why is None
    kept, why = keep_release_choice(INT8, [FP32, INT8, DYN], "fp32", "p50", 0.10)  # 2x
    assert kept.name == "tflite-int8" and why is None


def test_a_release_choice_that_no_longer_qualifies_or_is_gone_is_not_kept():
    # ``qualified`` holds only the finalists that pass the gate: a release variant outside it is not kept
    assert keep_release_choice(INT8, [FP32, INT8], "tflite-dynamic", "p50", 10.0) == (INT8, None)
    assert keep_release_choice(INT8, [FP32, INT8, DYN], None, "p50", 10.0) == (INT8, None)


def test_the_size_objective_and_an_already_kept_choice_change_nothing():
    assert keep_release_choice(INT8, [FP32, INT8, DYN], "tflite-dynamic", "size", 10.0) == (INT8, None)
    assert keep_release_choice(DYN, [FP32, INT8, DYN], "tflite-dynamic", "p50", 0.10) == (DYN, None)


def test_the_p99_objective_is_judged_by_the_tail():
    steady, spiky = _finalist("steady", 1.0, 100_000, p99=1.1), _finalist("spiky", 0.9, 90_000, p99=3.0)
    kept, why = keep_release_choice(steady, [steady, spiky], "spiky", "p99", 0.10)  # 3.0 vs 1.1: not kept
    assert kept.name == "steady" and why is None
    kept, why = keep_release_choice(spiky, [steady, spiky], "steady", "p99", 0.10)  # the release's is the fastest tail
    assert kept.name == "steady" and why["ratio_to_fastest"] == 1.0
