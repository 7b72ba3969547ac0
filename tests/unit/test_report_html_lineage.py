"""The HTML report's lineage (edgekit/report/html_lineage.py): one file measured under several runtime settings
(the digits demo: a TFLite file under threads x delegate x options) shows its lineage once, naming the settings
that share it; each step's kind, hop, precision, parity and time are columns; the full record is collapsed
key/value tables, never raw dict text."""

from __future__ import annotations

import re

from edgekit.report.html import render_html
from edgekit.report.html_lineage import group_lineages, step_precision
from edgekit.report.model import LineageStep
from tests.unit.html_tree import parse
from tests.unit.report_factory import report, variant

SETTINGS = [("tflite-dynamic", 1, "xnnpack", None),
            ("tflite-dynamic@api=compiled", 1, "xnnpack", {"api": "compiled"}),
            ("tflite-dynamic@t2", 2, "xnnpack", None),
            ("tflite-dynamic@t2,api=compiled", 2, "xnnpack", {"api": "compiled"}),
            ("tflite-dynamic@t2,xnnpack=off", 2, None, {"xnnpack": "off"}),
            ("tflite-dynamic@xnnpack=off", 1, None, {"xnnpack": "off"}),
            ("tflite-dynamic@t4", 4, "xnnpack", None), ("tflite-dynamic@t4,xnnpack=off", 4, None, {"xnnpack": "off"})]


def _parity(reference: str, err: float, n: int) -> dict:
    return {"reference": reference, "max_abs_err": err, "mean_abs_err": err / 5, "cosine": 0.999995,
            "top1_agreement": 1.0, "n": n, "exact_agreement": None, "distribution": False, "top1_held": True}


def _tflite_lineage() -> list[dict]:
    """The digits demo's TFLite lineage as report.json holds it (examples/digits/run.sh)."""
    return [
        {"kind": "source", "name": "torch.export", "config": {"path": "examples/digits/artifacts/model.pt2"},
         "metrics": {}},
        {"kind": "convert", "name": "torch->onnx", "seconds": 0.004, "input_sha256": "f6" * 32,
         "config": {"opset": 18, "exporter": "torch.onnx dynamo", "torch": "2.13.0+cpu"},
         "metrics": {"parity": _parity("pytorch", 7.63e-6, 360),
                     "parity_outputs": {"linear_1": _parity("pytorch", 7.63e-6, 360)}, "parity_violations": [],
                     "cache": {"hit": True, "key": "5c3677e8b7a3c52c", "original_seconds": 1.624}}},
        {"kind": "convert", "name": "onnx->tflite", "seconds": 0.574, "input_sha256": "7b" * 32,
         "config": {"precision": "int8", "quantization": "dynamic", "io": "float", "calibration_samples": 200,
                    "allow_float_fallback": False, "input_shapes": None, "pseudo_ops": [], "converter": "onnx2tf"},
         "metrics": {"parity": _parity("onnx", 0.083, 64), "parity_outputs": {"linear_1": _parity("onnx", 0.083, 64)},
                     "parity_violations": [], "route": "onnx2tf", "precision": "int8-dynamic",
                     "chain_parity": _parity("pytorch", 0.083, 64), "routes_tried": []}},
    ]


def _digits_like():
    """fp32 ONNX plus one TFLite file raced under eight runtime settings (same sha256, same lineage)."""
    tfl = []
    for i, (name, threads, delegate, options) in enumerate(SETTINGS):
        v = variant(name, median=0.4 + 0.01 * i, precision="int8", seed=10 + i, size=30_000,
                    device_state={"before": {"loadavg": [0.98, 0.55, 0.96], "governor": None},
                                  "after": {"loadavg": [0.98 + 0.01 * i, 0.56, 0.96]}})
        v.format, v.sha256 = "tflite", "b4d8c8b8e4" + "0" * 54
        v.runtime = v.runtime.model_validate({"name": "litert", "version": "ai_edge_litert 2.3.0",
                                              "threads": threads, "delegate": delegate, "options": options})
        v.lineage = [LineageStep.model_validate(s) for s in _tflite_lineage()]
        tfl.append(v)
    return report([variant("fp32"), *tfl])


def _lineage_section(html: str):
    tree = parse(html[html.index("<h2 id=lineage>"):])
    return tree, list(tree.iter("details", cls="lineage"))


def test_one_file_under_eight_settings_shows_its_lineage_once_naming_them():
    r = _digits_like()
    html = render_html(r)
    _, blocks = _lineage_section(html)
    assert len(blocks) == 2  # fp32's file and the TFLite file: not one block a variant (9)
    tfl = blocks[1]
    summary = next(tfl.iter("summary")).text()
    assert "shared by 8 settings" in summary and "b4d8c8b8e400" in summary
    for name, *_ in SETTINGS:
        assert name in summary, name
    settings = next(tfl.iter("table", cls="lineage-settings")).rows()
    assert [row[0].text() for row in settings[1:]] == [s[0] for s in SETTINGS]
    by_name = {row[0].text(): row[1].text() for row in settings[1:]}
    t4_off = by_name["tflite-dynamic@t4,xnnpack=off"]
    assert "4 threads" in t4_off and "xnnpack: off" in t4_off and "delegate" not in t4_off
    assert "delegate xnnpack" in by_name["tflite-dynamic@t2"] and "2 threads" in by_name["tflite-dynamic@t2"]
    assert html.count("onnx-&gt;tflite</td>") == 1  # the hop's row, once on the page
    # grouping is by file: every setting lands in one group, in report order
    groups = group_lineages(r.variants)
    assert [[v.name for v in g.variants] for g in groups] == [["fp32"], [s[0] for s in SETTINGS]]


def test_different_files_keep_their_own_lineage():
    a, b = variant("fp32"), variant("int8", precision="int8", seed=2)
    html = render_html(report([a, b]))
    _, blocks = _lineage_section(html)
    assert len(blocks) == 2 and not any("shared by" in next(x.iter("summary")).text() for x in blocks)
    b2 = variant("int8-copy", precision="int8", seed=3)
    b2.sha256 = "f" * 64  # a different file with the same history: still its own block
    assert len(group_lineages([a, b, b2])) == 3


def test_lineage_columns_hold_kind_hop_precision_parity_and_time():
    _, blocks = _lineage_section(render_html(_digits_like()))
    table = next(blocks[1].iter("table", cls="lineage-steps"))
    rows = table.rows()
    assert [c.text() for c in rows[0]] == ["#", "kind", "hop", "precision", "parity", "time", "record"]
    cells = {row[2].text(): [c.text() for c in row] for row in rows[1:]}
    assert list(cells) == ["torch.export", "torch->onnx", "onnx->tflite"]
    _, kind, _, precision, parity, time, _ = cells["onnx->tflite"]
    assert kind == "convert" and precision == "int8-dynamic"
    assert "max |err| 8.30e-02" in parity and "top-1 100.0%" in parity and "vs onnx" in parity
    assert "within tolerance" in parity and time == "0.57 s"
    onnx = cells["torch->onnx"]
    assert onnx[1] == "convert" and "max |err| 7.63e-06" in onnx[4] and "vs pytorch" in onnx[4]
    assert onnx[5].startswith("0.00 s") and "cache hit; built in 1.62 s" in onnx[5]
    assert cells["torch.export"][1] == "source" and cells["torch.export"][4] == ""  # no parity: an empty cell


def test_the_full_record_is_collapsed_key_value_tables_not_dict_text():
    html = render_html(_digits_like())
    _, blocks = _lineage_section(html)
    section = html[html.index("<h2 id=lineage>"):]
    for raw in ("{'", '{"', "{&quot;", "{&#x27;", "[{", "': ", '": '):
        assert raw not in section, raw
    table = next(blocks[1].iter("table", cls="lineage-steps"))
    record = table.rows()[3][6]  # the onnx->tflite row's record cell
    details = next(record.iter("details"))
    assert "open" not in details.attrs  # collapsed
    flat = re.sub(r"\s+", " ", section)
    assert "<th>calibration_samples</th><td>200</td>" in flat and "<th>allow_float_fallback</th><td>no</td>" in flat
    assert "<th>route</th><td>onnx2tf</td>" in flat
    # the nested parity record is a table of its own, not text
    chain = [tr for tr in details.iter("tr")
             if tr.children and not isinstance(tr.children[0], str) and tr.children[0].text() == "chain_parity"]
    assert len(chain) == 1
    nested = next(chain[0].iter("table", cls="record"))
    assert ["reference", "pytorch"] in [[c.text() for c in row] for row in nested.rows()]


def test_step_precision_reads_what_the_step_recorded():
    assert step_precision(LineageStep(kind="convert", name="onnx->tflite", metrics={"precision": "int8-dynamic"},
                                      config={"precision": "int8"})) == "int8-dynamic"
    assert step_precision(LineageStep(kind="convert", name="x", config={"precision": "fp16"})) == "fp16"
    assert step_precision(LineageStep(kind="pass", name="q", metrics={"quantization": {"headline": "int4 g32"}})) \
        == "int4 g32"
    assert step_precision(LineageStep(kind="pass", name="q", metrics={"quantization": {"requested": "Q4_0"}})) == "Q4_0"
    assert step_precision(LineageStep(kind="pass", name="quantize", config={"mode": "static"}), "int8") == "int8"
    assert step_precision(LineageStep(kind="source", name="torch.export")) == ""
