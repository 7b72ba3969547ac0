"""A latency budget as a goal (issue #46): the search prunes channels, measured on the device, until the budget
holds; a group whose pruning does not pay on the device is left whole; an impossible budget is exit 1 with the
closest point; pruned residual and depthwise networks convert with parity; bad inputs are exit 2 before any
training. Real Torch-Pruning, real training (one torch thread), real ONNX Runtime on `local`."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.inputs.targets import MeasureDefaults
from edgekit.orchestration.options import DeployOptions
from edgekit.variant_search import SearchOptions, search
from edgekit.variant_search.budget import plan_widths, width_grid
from edgekit.variant_search.latency_table import LatencyTable, Point

HERE = Path(__file__).resolve().parent
MODELS = HERE / "_budget_models.py"
FAST = MeasureDefaults(warmup=5, runs=60, min_seconds=0.2, threads=1)


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _models():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_budget_models", MODELS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("planted")
    _models().trained(_models().PlantedNet, out, epochs=5)
    return out


def _search(d: Path, out: Path, budget: float, arch: str = "PlantedNet", train: str = "train.npz", **kw):
    return search(str(d / "model.pt2"), eval_data=str(d / "eval.npz"), arch=f"{MODELS}:{arch}", out=out,
                  options=SearchOptions(candidates=[], tune_runtime=False, measure=FAST),
                  deploy_options=DeployOptions(latency_budget_ms=budget, train_data=str(d / train),
                                               max_accuracy_drop=3.0, **kw))


def _table(base: float, points: dict[str, dict[int, float]]) -> LatencyTable:
    """A table written here, not measured: for the planner's own logic (the measured one is tested below)."""
    return LatencyTable(key="k", encoding="fp32", runtime="onnxruntime", runtime_version=None, device={},
                        base=Point(base, (base * 0.99, base * 1.01)),
                        points={g: {w: Point(p, (p * 0.99, p * 1.01), p / base, (p / base - 0.01, p / base + 0.01))
                                    for w, p in ws.items()} for g, ws in points.items()})


def test_the_plan_never_prunes_a_group_whose_widths_do_not_pay():
    # "cheap" loses no accuracy at any width, but is no faster on the device: a MAC- or accuracy-led plan would
    # prune it first; the table says it buys nothing, so it stays whole and the budget comes from "trunk"
    t = _table(1.0, {"cheap": {8: 1.0, 4: 1.005}, "trunk": {48: 0.8, 32: 0.6, 16: 0.45}})
    loss = {"cheap": {8: 0.0, 4: 0.0}, "trunk": {48: 0.5, 32: 1.0, 16: 4.0}}
    plan = plan_widths(t, loss, {"cheap": 16, "trunk": 64}, target_ms=0.7)
    assert plan.widths == {"trunk": 32} and plan.feasible
    assert "cheap" in plan.unpaid and "no width of cheap is clearly faster" in plan.unpaid["cheap"]
    assert plan.predicted_ms == pytest.approx(0.6) and plan.predicted_loss == pytest.approx(1.0)
    # two groups' ratios multiply (a fixed per-inference cost is not pruned away)
    assert t.predict({"trunk": 32, "cheap": 4}) == pytest.approx(0.6 * 1.005)
    # nothing meets the target: the fastest prediction, said to be infeasible
    fastest = plan_widths(t, loss, {"cheap": 16, "trunk": 64}, target_ms=0.1)
    assert not fastest.feasible and fastest.widths == {"trunk": 16}


def test_width_grid_rounds_to_a_simd_quantum():
    grid = width_grid({"a": 64, "b": 16, "c": 6, "d": 1})
    assert grid["a"] == [48, 32, 16] and grid["b"] == [12, 8, 4]
    assert all(w % 8 == 0 for w in grid["a"]) and "d" not in grid


@pytest.mark.slow
def test_a_budget_is_met_by_pruning_and_the_planted_group_is_left_whole(planted, tmp_path):
    first = _search(planted, tmp_path / "a", 1e6)  # the float model's p50 on this device
    assert first.search.budget["pruning"].startswith("not needed")
    base_p50 = first.variant("fp32").latency_ms.p50
    budget = round(base_p50 * 0.6, 6)
    rep = _search(planted, tmp_path / "b", budget)
    b = rep.search.budget
    assert rep.gate.passed, rep.gate.checks
    shipped = rep.variant(rep.decision.ship)
    assert shipped.name.startswith("pruned-") and shipped.latency_ms.ci95[1] <= budget
    plan = b["rounds"][0]["plan"]
    # the planted group (the head's 16 hidden units) costs nothing measurable on the device: left whole, with the
    # table's figures as the reason; the trunk's convs are what got pruned
    assert "head.2" not in plan["widths"] and "head.2" in plan["left_unpruned"]
    assert plan["widths"] and all(g.startswith("trunk.") for g in plan["widths"])
    table = b["latency_table"]
    assert table["encoding"] == "fp32" and table["runtime"] == "onnxruntime" and not table["reused"]
    assert set(table["points"]) == {"head.2", "trunk.0", "trunk.3", "trunk.6"}
    # both students of the same shape, measured, each with its prediction beside the measurement
    students = [s for r in b["rounds"] for s in (r.get("students") or {}).values() if s]
    assert {s["name"].split("-")[-1] for s in students} >= {"finetuned", "distilled"}
    assert all(s["predicted_p50_ms"] > 0 and s["p50_ms"] > 0 for s in students)
    assert "over fine-tuning alone" in b["rounds"][0]["distillation"]
    # the frontier: every device-measured point, the float one over the budget
    names = {p["name"]: p for p in b["frontier"]}
    assert not names["fp32"]["meets_budget"] and names[shipped.name]["meets_budget"]
    assert (tmp_path / "b" / "ship" / "ship.json").is_file()
    md = (tmp_path / "b" / "report.md").read_text()  # report.md: predicted beside measured, the planted group, frontier
    assert "## Latency budget" in md and "| predicted p50 ms | measured p50 ms |" in md
    assert "Left whole: no width of head.2" in md and "Frontier (every device-measured point" in md
    # the table is kept for this device, runtime and encoding: the next run measures no point again
    again = _search(planted, tmp_path / "c", budget)
    assert again.search.budget["latency_table"]["reused"]


@pytest.mark.slow
def test_an_impossible_budget_fails_naming_the_closest_point(planted, tmp_path):
    rep = _search(planted, tmp_path, 1e-4)
    assert not rep.gate.passed and rep.decision.ship is None
    search_check = next(c for c in rep.gate.checks if c.name == "search")
    assert "the closest measured point is" in search_check.message and "0.0001 ms budget" in search_check.message
    assert not (tmp_path / "ship" / "model.onnx").exists()
    rounds = rep.search.budget["rounds"]
    assert not rounds[0]["plan"]["feasible"]


def _untrained(d: Path, cls: str, labels_offset: int = 0) -> Path:
    """``cls`` with its random weights and quadrant data (no training: these inputs fail before any)."""
    import numpy as np
    import torch

    mod = _models()
    x, y = mod.quadrants(64, 0)
    d.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(getattr(mod, cls)().eval(), (torch.from_numpy(x[:1]),)), str(d / "model.pt2"))
    np.savez(d / "train.npz", x=x, y=y + labels_offset)
    np.savez(d / "eval.npz", x=x, y=y)
    return d


def test_training_labels_outside_the_models_classes_fail_before_training(tmp_path):
    from edgekit.errors import DataError

    d = _untrained(tmp_path / "d", "PlantedNet", labels_offset=7)  # the model predicts 4 classes
    with pytest.raises(DataError, match=r"labels .* run 7\.\.10, but the model predicts 4 classes") as exc:
        _search(d, tmp_path / "out", 0.1)
    assert exc.value.exit_code == 2
    assert not list((tmp_path / "out").rglob("*prune_widths*"))  # nothing was pruned or trained


def test_a_model_without_a_prunable_group_is_named(tmp_path):
    from edgekit.errors import BadInputError

    d = _untrained(tmp_path / "d", "Single")
    with pytest.raises(BadInputError, match="Single has no prunable group") as exc:
        _search(d, tmp_path / "out", 0.1, arch="Single")
    assert exc.value.exit_code == 2


@pytest.mark.slow
def test_a_pruned_residual_depthwise_network_converts_with_parity(tmp_path):
    """The residual add ties the stem's channels to the projection's, the depthwise conv ties its inputs to its
    outputs: pruned to widths, the model still exports to ONNX and converts to LiteRT (fp32 and INT8) in parity."""
    from edgekit.formats import Format
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.recipe import PassStep, Recipe, VariantSpec
    from edgekit.inputs.source import load_pt2
    from edgekit.orchestration.steps import build_variants
    from edgekit.passes.base import PassContext

    d = _untrained(tmp_path / "d", "ResDW")
    ctx = PassContext(workdir=tmp_path / "w", eval=load_npz(d / "eval.npz"), calib=load_npz(d / "eval.npz"),
                      train=load_npz(d / "train.npz", role="train"), arch=f"{MODELS}:ResDW")
    source = load_pt2(d / "model.pt2")
    prune = PassStep(name="prune_widths", config={"widths": {"project.0": 16, "dw.0": 24}, "finetune_epochs": 1})
    specs = [VariantSpec(name="onnx", passes=[prune]),
             VariantSpec(name="tflite-fp32", passes=[prune, PassStep(name="convert",
                                                                     config={"to": "tflite", "precision": "fp32"})]),
             VariantSpec(name="tflite-int8", passes=[prune, PassStep(name="convert", config={
                 "to": "tflite", "precision": "int8", "io": "float", "parity_bar": "breakage"})]),
             VariantSpec(name="openvino-fp32", passes=[prune, PassStep(
                 name="convert", config={"to": "openvino", "precision": "fp32"})])]
    # ExecuTorch is not installed in this environment (no executorch wheel beside this torch): its route is not tried
    arts = build_variants(source.artifact, Recipe(baseline="fp32", variants=specs), ctx, lambda _m: None,
                          source=source)
    widths = arts["onnx"].lineage[-2].metrics["widths"]
    # a group is named by its root: the residual group (stem, project and the add) and the depthwise group
    # (expand's outputs, dw's channels)
    assert widths == {"project.0": 16, "dw.0": 24}
    import torch

    sd = torch.export.load(str(sorted((tmp_path / "w").glob("onnx-0-prune_widths*.pt2"))[0])).state_dict
    assert sd["stem.0.weight"].shape[0] == 16 and sd["project.0.weight"].shape[0] == 16  # tied by the add
    assert sd["expand.0.weight"].shape[0] == 24 and sd["dw.0.weight"].shape[0] == 24  # tied by the depthwise conv
    assert arts["onnx"].format == Format.ONNX and arts["tflite-int8"].format == Format.TFLITE
    assert arts["openvino-fp32"].format == Format.OPENVINO
    for name, art in arts.items():
        if name == "fp32":
            continue
        hops = [s for s in art.lineage if s.kind == "convert"]
        assert hops, name
        for h in hops:
            assert not h.metrics.get("parity_violations"), (name, h.name, h.metrics.get("parity_violations"))
    onnx_hop = next(s for s in arts["onnx"].lineage if s.kind == "convert")
    assert onnx_hop.metrics["parity"]["max_abs_err"] < 1e-4


def test_without_training_data_a_missed_budget_says_pruning_would_open(tmp_path):
    d = _untrained(tmp_path / "d", "PlantedNet")
    rep = search(str(d / "model.pt2"), eval_data=str(d / "eval.npz"), out=tmp_path / "out",
                 options=SearchOptions(candidates=[], tune_runtime=False, measure=FAST),
                 deploy_options=DeployOptions(latency_budget_ms=1e-4))
    assert not rep.gate.passed and rep.search.budget is None  # the budget stayed a gate check
    msg = next(c for c in rep.gate.checks if c.name == "search").message
    assert "no encoding meets the 0.0001 ms budget: training data (--train-data) and the architecture (--arch) " \
           "would let the search prune channels" in msg


def test_the_time_budget_holds_pruning_is_not_started_past_it(tmp_path):
    d = _untrained(tmp_path / "d", "PlantedNet")
    rep = search(str(d / "model.pt2"), eval_data=str(d / "eval.npz"), arch=f"{MODELS}:PlantedNet",
                 out=tmp_path / "out", options=SearchOptions(candidates=[], tune_runtime=False, measure=FAST,
                                                             time_budget_s=0.5),
                 deploy_options=DeployOptions(latency_budget_ms=1e-4, train_data=str(d / "train.npz")))
    assert rep.search.budget["pruning"].startswith("not tried: the 0.5 s time budget was spent")
    assert not rep.gate.passed and "the closest measured point is fp32" in next(
        c for c in rep.gate.checks if c.name == "search").message
