"""Memory and size budgets as goals, an explicit teacher from `edgekit train`, the students' epochs in the
progress and the frontier plot in report.html (issue #46). Real Torch-Pruning, real training (one torch thread),
real ONNX Runtime on `local`; the tiny models of ``_budget_models.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from edgekit.inputs.targets import MeasureDefaults
from edgekit.orchestration.options import DeployOptions
from edgekit.variant_search import SearchOptions, search

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
    spec = importlib.util.spec_from_file_location("_budget_models", MODELS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _untrained(d: Path, cls: str = "PlantedNet", train_x=None) -> Path:
    import torch

    mod = _models()
    x, y = mod.quadrants(64, 0)
    d.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(getattr(mod, cls)().eval(), (torch.from_numpy(x[:1]),)), str(d / "model.pt2"))
    np.savez(d / "train.npz", x=x if train_x is None else train_x, y=y)
    np.savez(d / "eval.npz", x=x, y=y)
    return d


def _search(d: Path, out: Path, arch: str = "PlantedNet", progress=None, candidates=(), **kw):
    return search(str(d / "model.pt2"), eval_data=str(d / "eval.npz"), arch=f"{MODELS}:{arch}", out=out,
                  options=SearchOptions(candidates=list(candidates), tune_runtime=False, measure=FAST),
                  progress=progress,
                  deploy_options=DeployOptions(train_data=str(d / "train.npz"), max_accuracy_drop=3.0, **kw))


def _count(model) -> int:
    return sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())


def test_the_parameter_count_of_any_widths_is_exact_without_pruning_again():
    """The size planner's count: per-group slopes found once, then any combination of widths, exactly as Torch-
    Pruning leaves the model (a conv's channels, the linear layer after the pooled trunk, a residual add's tied
    channels and a depthwise conv's)."""
    import copy

    import torch

    from edgekit.passes.prune_latency import param_model, prunable_groups, prune_to_widths
    from edgekit.variant_search.budget import width_grid

    mod = _models()
    cases = {"PlantedNet": [{"trunk.0": 16}, {"trunk.3": 32, "trunk.6": 16, "head.2": 8},
                            {"trunk.0": 8, "trunk.6": 48}],
             "ResDW": [{"project.0": 16, "dw.0": 24}, {"dw.0": 16}, {"project.0": 8}]}
    for cls, combos in cases.items():
        model = getattr(mod, cls)().eval()
        ex = (torch.zeros(1, 3, 16, 16),)
        groups = prunable_groups(model, ex)
        pm = param_model(model, ex, groups, width_grid({g.name: g.width for g in groups}))
        assert pm.params({}) == _count(model)
        for widths in combos:
            m = copy.deepcopy(model)
            prune_to_widths(m, ex, widths)
            assert pm.params(widths) == _count(m), (cls, widths)


class _Stub:
    """A predictor written here (the planner's own logic): ``each`` group width -> what it saves."""

    def __init__(self, quantity: str, base: float, saves: dict[str, dict[int, float]], pays: bool = True):
        self.quantity, self.base, self.saves, self._pays = quantity, base, saves, pays

    def predict(self, widths):
        return self.base - sum(self.saves.get(g, {}).get(w, 0.0) for g, w in widths.items())

    def paying(self, group):
        return sorted(self.saves.get(group, {}), reverse=True) if self._pays else []

    def unpaid(self, group):
        return None if self._pays else f"{group} buys no {self.quantity}"

    def to_dict(self):
        return {}


def test_the_plan_meets_every_budget_at_the_least_loss():
    from edgekit.variant_search.budget import Constraint, plan

    groups = {"a": 64, "b": 64}
    loss = {"a": {48: 0.1, 32: 0.5, 16: 3.0}, "b": {48: 0.2, 32: 0.4, 16: 1.0}}
    # latency: only a's widths pay; size: both groups' widths shrink the file
    lat = _Stub("latency", 1.0, {"a": {48: 0.2, 32: 0.4, 16: 0.6}})
    size = _Stub("size", 10.0, {"a": {48: 1.0, 32: 2.0, 16: 3.0}, "b": {48: 1.0, 32: 2.0, 16: 3.0}})
    p = plan([Constraint(lat, 0.7), Constraint(size, 6.5)], loss, groups)
    # a=32 is the cheapest width under 0.7 ms; it leaves 8 MB: b=32 brings it to 6 MB at 0.4 points (b=16 costs more)
    assert p.feasible and p.widths == {"a": 32, "b": 32}
    assert p.predicted == {"latency": pytest.approx(0.6), "size": pytest.approx(6.0)}
    assert p.predicted_loss == pytest.approx(0.9) and p.to_dict()["predicted_p50_ms"] == pytest.approx(0.6)
    # a group that buys nothing budgeted is left whole, and says why
    mem = _Stub("memory", 100.0, {}, pays=False)
    q = plan([Constraint(mem, 50.0)], loss, groups)
    assert not q.widths and not q.feasible and q.unpaid == {"a": "a buys no memory", "b": "b buys no memory"}


def test_a_size_budget_is_a_gate_budget_from_the_options():
    from edgekit.inputs.recipe import Recipe
    from edgekit.inputs.targets import load_target
    from edgekit.orchestration.options import resolve_gate
    from edgekit.variant_search.goal import budgets_of

    gate = resolve_gate(load_target("local"), Recipe(), DeployOptions(size_budget_mb=0.25, memory_budget_mb=80))
    assert gate.model_size_mb == 0.25 and gate.peak_memory_mb == 80
    assert [(b.quantity, b.limit) for b in budgets_of(gate)] == [("memory", 80.0), ("size", 0.25)]


def test_training_data_of_another_shape_fails_before_any_training(tmp_path):
    from edgekit.errors import DataError

    x8 = np.zeros((64, 3, 8, 8), np.float32)  # the model takes 3x16x16
    d = _untrained(tmp_path / "d", train_x=x8)
    with pytest.raises(DataError, match=r"train data train.npz: samples have shape \(3, 8, 8\)") as exc:
        _search(d, tmp_path / "out", size_budget_mb=0.01)
    assert exc.value.exit_code == 2
    assert not list((tmp_path / "out").rglob("*prune_widths*"))


def _teacher_pt2(path: Path, classes: int) -> Path:
    import torch
    from torch import nn

    m = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, classes)).eval()
    torch.export.save(torch.export.export(m, (torch.zeros(1, 3, 16, 16),)), str(path))
    return path


def test_a_teacher_whose_outputs_do_not_match_fails_before_any_training(tmp_path):
    from edgekit.errors import BadInputError

    d = _untrained(tmp_path / "d")  # PlantedNet predicts 4 classes
    bad = _teacher_pt2(tmp_path / "teacher5.pt2", 5)
    with pytest.raises(BadInputError, match=r"teacher5.pt2's outputs have shape \(5,\) a sample, the deployed "
                                            r"model's \(4,\)") as exc:
        _search(d, tmp_path / "out", size_budget_mb=0.01, teacher=str(bad))
    assert exc.value.exit_code == 2 and "edgekit train" in (exc.value.hint or "")
    assert not list((tmp_path / "out").rglob("*prune_widths*")) and not list((tmp_path / "out").rglob("*distill*"))
    # a teacher with nothing to teach (no budget as a goal) is named too, before any work
    with pytest.raises(BadInputError, match="--teacher teaches the distilled student of a budget search"):
        _search(d, tmp_path / "out2", teacher=str(_teacher_pt2(tmp_path / "teacher4.pt2", 4)))


def test_a_recipes_distill_step_takes_the_teacher_and_refuses_a_mismatched_one_before_training(tmp_path):
    """A recipe deploy: --teacher is the distill steps' default teacher, checked before any pass trains."""
    import edgekit
    from edgekit.errors import BadInputError
    from edgekit.inputs.recipe import PassStep, Recipe, VariantSpec

    d = _untrained(tmp_path / "d")
    recipe = Recipe(baseline="fp32", variants=[VariantSpec(name="kd", passes=[PassStep(
        name="distill", config={"epochs": 1, "student": f"{MODELS}:PlantedNet"})])])
    with pytest.raises(BadInputError, match=r"outputs have shape \(5,\) a sample") as exc:
        edgekit.deploy(str(d / "model.pt2"), eval_data=str(d / "eval.npz"), recipe=recipe, out=tmp_path / "out",
                       train_data=str(d / "train.npz"), teacher=str(_teacher_pt2(tmp_path / "t5.pt2", 5)))
    assert exc.value.exit_code == 2 and not list((tmp_path / "out").rglob("*distill*"))
    rep = edgekit.deploy(str(d / "model.pt2"), eval_data=str(d / "eval.npz"), recipe=recipe, out=tmp_path / "ok",
                         train_data=str(d / "train.npz"), teacher=str(_teacher_pt2(tmp_path / "t4.pt2", 4)),
                         runs=20, min_seconds=0.0, warmup=2)
    step = next(s for s in rep.variant("kd").lineage if s.name == "distill")
    assert step.metrics["teacher"] == str(tmp_path / "t4.pt2")


def test_the_cli_takes_the_size_budget_and_the_teacher_and_names_the_budgets_it_selected_inside(cli, tmp_path):
    from types import SimpleNamespace

    from edgekit.cli import common
    from edgekit.cli.deploy import _print_search

    d = _untrained(tmp_path / "d")
    r = cli("deploy", d / "model.pt2", "--eval-data", d / "eval.npz", "--train-data", d / "train.npz", "--arch",
            f"{MODELS}:PlantedNet", "--size-budget-mb", "0.01", "--teacher", _teacher_pt2(tmp_path / "t5.pt2", 5),
            "--out", tmp_path / "o")
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "outputs have shape (5,) a sample" in " ".join(r.stderr.split())
    budget = {"budgets": {"memory": {"limit": 80, "unit": "MB"}, "size": {"limit": 0.1, "unit": "MB"}}}
    search_section = SimpleNamespace(mode="full", selected="pruned-distilled", seconds=12.0, shipped=None,
                                     timeline=None, objective="p50", budget=budget)
    with common.out_console.capture() as cap:
        _print_search(SimpleNamespace(search=search_section))
    assert "selected pruned-distilled by accuracy inside the 80 MB memory and 0.1 MB size budgets" in cap.get()


def test_the_frontier_plot_marks_the_budget_the_shipped_point_and_why_the_others_lost():
    from edgekit.report.html_budget import frontier_svg

    rec = {"budgets": {"latency": {"limit": 0.5, "unit": "ms"}},
           "frontier": [{"name": "pruned-distilled", "p50_ms": 0.3, "accuracy": 97.0, "size_bytes": 1000,
                         "meets_budget": True, "shipped": True},
                        {"name": "pruned-finetuned", "p50_ms": 0.31, "accuracy": 95.5, "size_bytes": 1000,
                         "meets_budget": True, "shipped": False,
                         "lost": "inside the budget, but less accurate than the shipped point"},
                        {"name": "fp32", "p50_ms": 0.9, "accuracy": 98.0, "size_bytes": 4000, "meets_budget": False,
                         "shipped": False, "lost": "latency 0.95 ms over the 0.5 ms latency budget"}]}
    html = frontier_svg(rec)
    assert html.startswith("<figure><svg id=budget-frontier") and "<script" not in html
    assert html.count("<circle") == 3 and html.count("class='shipped'") == 1 and "class=budget-line" in html
    assert "<b>fp32</b>: 0.9 · accuracy 98 · latency 0.95 ms over the 0.5 ms latency budget" in html
    assert "less accurate than the shipped point" in html
    # no latency budget: the x axis is the budgeted quantity (size, in MB)
    size = frontier_svg({"budgets": {"size": {"limit": 0.002, "unit": "MB"}}, "frontier": rec["frontier"]})
    assert "file size, MB" in size and "budget 0.002" in size
    assert frontier_svg({"frontier": []}) == ""


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("planted")
    _models().trained(_models().PlantedNet, out, epochs=5)
    return out


@pytest.mark.slow
def test_a_size_budget_is_met_by_pruning_distilled_from_an_edgekit_train_teacher(planted, tmp_path):
    """A size budget at half the float file: the size model plans from parameter counts (no latency table), both
    students are built, the distilled one learns from the checkpoint `edgekit train` wrote (read with
    weights_only=True), the progress says each student's epochs and the points measured, report.html plots the
    frontier."""
    import edgekit

    teacher = edgekit.train(f"{MODELS}:PlantedNet", data=planted / "train.npz", out=tmp_path / "teacher.pt2",
                            epochs=2, threads=1)
    ckpt = Path(teacher.out).with_suffix(".ckpt") / "last.pt"
    assert ckpt.is_file()
    from edgekit.inputs.recipe import PassStep, VariantSpec

    int8 = [VariantSpec(name="ort-int8-dynamic", passes=[PassStep(name="quantize", config={"mode": "dynamic"})])]
    said: list[str] = []
    first = _search(planted, tmp_path / "a", size_budget_mb=1e3, candidates=int8)
    small = first.variant("ort-int8-dynamic").size_bytes / 1e6
    budget = round(small * 0.6, 6)  # the INT8 file is over it: the search prunes in INT8, not in fp32
    rep = _search(planted, tmp_path / "b", size_budget_mb=budget, teacher=str(ckpt), progress=said.append,
                  candidates=int8)
    b = rep.search.budget
    assert rep.gate.passed, rep.gate.checks
    shipped = rep.variant(rep.decision.ship)
    assert shipped.name.startswith("pruned-ort-int8-dynamic-") and shipped.size_bytes / 1e6 <= budget
    # a budget as a goal does not screen: the INT8 file over it reached the finals and is what was pruned
    assert b["encoding"] == "ort-int8-dynamic"
    assert next(c for c in rep.search.candidates if c.name == "ort-int8-dynamic").dropped_at == "finals"
    assert "latency_table" not in b and b["size_model"]["params_full"] > 0
    students = [s for r in b["rounds"] for s in (r.get("students") or {}).values() if s]
    assert {s["name"].split("-")[-1] for s in students} == {"finetuned", "distilled"}
    for s in students:  # the size is predicted from parameter counts before the file exists
        assert s["measured"]["size"] == pytest.approx(s["predicted"]["size"], rel=0.05), s
    kd = next(v for v in rep.variants if v.name.endswith("distilled"))
    step = next(s for s in kd.lineage if s.name == "distill")
    assert step.metrics["teacher"].endswith(".pt2") and "teacher-" in step.metrics["teacher"]
    assert b["teacher"]["outputs"] == [4]
    assert any("epoch 3/3" in m and "fine-tune" in m for m in said), said
    assert any("distillation epoch 3/3" in m and "points measured" in m for m in said), said
    html = (tmp_path / "b" / "report.html").read_text()
    assert "id=budget-frontier" in html and "class=budget-line" in html and "class='shipped'" in html
    shipped_pt = next(p for p in b["frontier"] if p["shipped"])
    assert shipped_pt["name"] == shipped.name
    assert next(p for p in b["frontier"] if p["name"] == "fp32")["lost"].startswith("size ")
    md = (tmp_path / "b" / "report.md").read_text()
    assert "## Size budget" in md and "Size model:" in md and "| predicted size MB | measured size MB |" in md


@pytest.mark.slow
def test_a_memory_budget_nothing_meets_is_exit_1_naming_the_closest_point(tmp_path):
    """A peak memory budget under what the runtime's process takes alone: the memory table (each point in its own
    run on the device) shows no width of the tiny model saves memory beyond the noise, nothing is pruned, and the
    failed gate names the closest measured point with its peak memory."""
    d = _untrained(tmp_path / "d")
    rep = _search(d, tmp_path / "out", memory_budget_mb=1.0)
    b = rep.search.budget
    assert not rep.gate.passed and rep.decision.ship is None
    msg = next(c for c in rep.gate.checks if c.name == "search").message
    assert "the closest measured point is fp32: peak memory" in msg and "against the 1 MB memory budget" in msg
    assert b["memory_table"]["base_peak_mb"] > 1.0 and set(b["memory_table"]["points"]) == {
        "head.2", "trunk.0", "trunk.3", "trunk.6"}
    rnd = b["rounds"][0]
    assert "nothing to prune" in rnd["stopped"] and not rnd["plan"]["widths"]
    assert all("saves more than" in why for why in rnd["plan"]["left_unpruned"].values())


@pytest.mark.slow
def test_a_memory_budget_is_met_by_pruning_the_widths_that_free_memory_on_the_device(tmp_path):
    """A model whose weights dominate the process's peak: a budget 6 MB under the float model's measured peak is met
    by pruning, planned from the memory table measured on the device, and judged on the shipped file's own peak."""
    d = tmp_path / "d"
    d.mkdir()
    _models().trained(_models().Wide, d, epochs=3)
    first = _search(d, tmp_path / "a", arch="Wide", memory_budget_mb=1e4)
    assert first.search.budget["pruning"].startswith("not needed")
    peak = first.variant("fp32").peak_memory_mb
    budget = round(peak - 6.0, 3)
    rep = _search(d, tmp_path / "b", arch="Wide", memory_budget_mb=budget)
    b = rep.search.budget
    assert rep.gate.passed, rep.gate.checks
    shipped = rep.variant(rep.decision.ship)
    assert shipped.name.startswith("pruned-") and shipped.peak_memory_mb <= budget
    table = b["memory_table"]
    assert set(table["points"]) == {"body.1", "body.3"} and "latency_table" not in b and "size_model" not in b
    plan = b["rounds"][0]["plan"]
    assert plan["feasible"] and plan["predicted"]["memory"] <= budget
    assert any(s and s["measured"]["memory"] <= budget for s in b["rounds"][-1]["students"].values())
    html = (tmp_path / "b" / "report.html").read_text()
    assert "peak memory, MB (device)" in html and "class='shipped'" in html
