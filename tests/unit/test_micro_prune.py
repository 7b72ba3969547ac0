"""Memory as the budget on a microcontroller (issue #44 item 6): with training data and the architecture, a model
whose TFLite Micro arena is over the part's SRAM is pruned (the structured-pruning pass), fine-tuned, re-converted
to full-integer INT8 and its arena bisected again until it fits; the gate judges the pruned file's TFLM accuracy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.orchestration.micro_prune import Resource, grid, plan_arena

MODELS = '''
import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.pool = nn.AvgPool2d(8)
        self.fc = nn.Linear(16 * 2 * 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.c2(self.c1(x))).flatten(1))
'''


def test_the_plan_keeps_the_most_that_fits_and_leaves_groups_that_do_not_shrink_the_arena_whole():
    groups = {"a": 16, "b": 16, "c": 8}
    widths = grid(groups)
    assert widths["a"] == [12, 8, 4] and widths["c"] == [6, 4, 2]
    slopes = {"a": 100.0, "b": 50.0, "c": 0.0}  # c's pruning alone did not move the peak
    loss = {"a": {12: 0.0, 8: 1.0, 4: 9.0}, "b": {12: 0.0, 8: 0.0, 4: 0.5}, "c": {6: 0.0, 4: 0.0, 2: 0.0}}
    flash = Resource("flash", 9000, {"a": 10.0, "b": 10.0, "c": 10.0}, 10000)  # inside: no constraint
    plan = plan_arena([Resource("arena", 5000, slopes, 4000), flash], loss, groups, widths)
    assert plan.feasible and "c" not in plan.widths
    # a at 12 (-400 B, free) and b at 4 (-600 B, 0.5 points) reach 4000 B; a at 8 costs a point
    assert plan.widths == {"a": 12, "b": 4} and plan.predicted == {"arena": 4000, "flash": 9000 - 40 - 120}
    assert plan.predicted_loss == 0.5
    none = plan_arena([Resource("arena", 5000, slopes, 100), flash], loss, groups, widths)
    assert not none.feasible and none.widths == {"a": 4, "b": 4} and none.predicted["arena"] == 5000 - 1200 - 600


def test_a_model_over_flash_only_is_pruned_by_the_weights_it_saves():
    groups = {"a": 16, "b": 16}
    loss = {"a": {12: 0.0, 8: 0.0, 4: 0.0}, "b": {12: 0.0, 8: 0.0, 4: 0.0}}
    arena = Resource("arena", 3000, {"a": 100.0, "b": 0.0}, 4000)  # fits already
    flash = Resource("flash", 12000, {"a": 50.0, "b": 250.0}, 10000)  # b's weights are the big ones
    plan = plan_arena([arena, flash], loss, groups, grid(groups))
    assert plan.feasible and plan.widths == {"b": 8} and plan.predicted["flash"] == 10000


@pytest.mark.slow  # trains, converts five INT8 files (two arena probes, the plan, measured) and runs TFLM: ~30 s
def test_a_model_over_sram_is_pruned_until_tflm_s_arena_fits(tmp_path):
    pytest.importorskip("tflite_micro", reason="the micro extra (pip install 'edgekit[micro]') is not installed")
    import importlib.util

    import torch
    import yaml
    from typer.testing import CliRunner

    from edgekit.cli.main import app
    from edgekit.micro.interpreter import smallest_arena
    from edgekit.orchestration.run_shipped import run_shipped

    (tmp_path / "models.py").write_text(MODELS)
    spec = importlib.util.spec_from_file_location("_micro_prune_models", tmp_path / "models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def quadrants(n, seed):  # which quadrant is brightest: learnable, spatial (a pooled global mean cannot)
        rng = np.random.default_rng(seed)
        x = rng.normal(0, 1, (n, 1, 16, 16)).astype(np.float32)
        y = rng.integers(0, 4, n)
        for i, q in enumerate(y):
            r, c = divmod(int(q), 2)
            x[i, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 1.5
        return x, y

    torch.manual_seed(0)
    x, y = quadrants(384, 0)
    xe, ye = quadrants(128, 1)
    net = mod.Net()
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(6):
        for i in range(0, len(x), 32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(torch.tensor(x[i:i + 32])), torch.tensor(y[i:i + 32])).backward()
            opt.step()
    net.eval()
    torch.export.save(torch.export.export(net, (torch.tensor(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "eval.npz", x=xe, y=ye)
    # the unpruned INT8 file's arena is ~10.4 KB: 8 KB of SRAM less the 10% fit margin is ~30% under it
    part = {"name": "tiny", "arch": "armv7e-m", "os": "none", "cores": 1, "runtimes": ["tflite-micro"],
            "transport": "host-interpreter", "microcontroller": {"core": "cortex-m4f", "clock_mhz": 64,
                                                                 "sram_kb": 8, "flash_kb": 256}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(part))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "m.pt2"), "--eval-data", str(tmp_path / "eval.npz"),
                                   "--train-data", str(tmp_path / "train.npz"), "--arch",
                                   f"{tmp_path / 'models.py'}:Net", "--target", str(tmp_path / "tiny.yaml"),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    rows = {v["name"]: v for v in report["variants"]}
    before, after = rows["tflm-int8"], rows["tflm-int8-pruned"]
    rec = after["micro"]["pruning"]
    budget = rec["sram_budget_bytes"]
    assert before["micro"]["arena"]["bytes"] == rec["arena_before_bytes"] > budget * 1.2  # over by a margin
    assert after["micro"]["arena"]["bytes"] == rec["arena_after_bytes"] <= budget  # measured again: it fits
    assert rec["widths"] and all(w < rec["groups"][g] for g, w in rec["widths"].items())
    assert rec["arena_table"] and rec["rounds"][-1]["fits"]
    assert rec["accuracy_cost"] == pytest.approx(before["accuracy"]["value"] - after["accuracy"]["value"])
    assert after["selected"] and not before.get("selected")
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert checks["micro_sram_fit"]["passed"] and checks["micro_sram_fit"]["variant"] == "tflm-int8-pruned"
    assert checks["accuracy_drop"]["variant"] == "tflm-int8-pruned" and checks["accuracy_drop"]["passed"]
    assert any("shipped tflm-int8-pruned" in w and "arena" in w for w in report["warnings"])
    ship = out / "ship"
    assert json.loads((ship / "micro.json").read_text())["arena_bytes"] == rec["arena_after_bytes"]
    # the shipped file's arena, bisected once more here, is the one the report gives
    assert smallest_arena(ship / "tflm-int8-pruned.tflite").bytes == rec["arena_after_bytes"]
    got = run_shipped(ship, {"x": xe})  # edgekit run ship/ reproduces the pruned file's TFLM accuracy
    top1 = float(np.mean(np.argmax(next(iter(got.values())), -1) == ye) * 100)
    assert abs(top1 - after["accuracy"]["value"]) < 1e-6
