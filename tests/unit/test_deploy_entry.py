"""One entry for every kind of model (issue #43 item 1): ``edgekit.deploy`` takes a language model's folder with
``eval_text`` as the CLI does, with the shared options (measurement, lock, memory budget) read from deploy's own
overrides and the language model's from ``lm_options``; a fixed graph's own arguments are refused by name before
any work, and a fixed graph without eval data is refused as before. Real tiny model (tests/lm_zoo.py), real
exporter, onnxruntime and agent."""

from __future__ import annotations

import pytest
from lm_zoo import build_tiny_lm, eval_text

import edgekit
from edgekit.errors import BadInputError


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_tiny_lm("llama"), eval_text(tmp_path_factory.mktemp("text"))


def test_edgekit_deploy_takes_a_language_model_folder(llama, tmp_path):
    folder, text = llama
    report = edgekit.deploy(
        folder, eval_text=text, target="local", out=tmp_path / "o", runs=10, warmup=2, min_seconds=0.05, threads=1,
        lm_options=edgekit.LMOptions(context=64, window=32, max_windows=2, candidates=("ort-fp32", "ort-int8")),
    )
    assert report.model["task"] == "text-generation" and {v.name for v in report.variants} == {"ort-fp32", "ort-int8"}
    # deploy's shared overrides reached the language model's measurement
    assert report.settings["measure"]["runs"] == 10 and report.settings["measure"]["threads"] == 1
    assert all(v.runtime.threads == 1 for v in report.variants)  # --threads fixed: no FILE@tN rows
    assert report.decision.ship in ("ort-fp32", "ort-int8") and (tmp_path / "o" / "ship" / "ship.json").is_file()


@pytest.mark.parametrize("given, named", [
    (dict(eval_data="eval.npz"), "eval_data"),
    (dict(recipe="recipe.yaml"), "recipe"),
    (dict(max_accuracy_drop=0.5), "max_accuracy_drop"),
    (dict(latency_budget_ms=2.0), "latency_budget_ms"),
])
def test_a_fixed_graph_argument_is_refused_for_a_language_model_by_name(llama, tmp_path, given, named):
    folder, text = llama
    with pytest.raises(BadInputError, match=f"does not take {named}"):
        edgekit.deploy(folder, eval_text=text, out=tmp_path / "o", **given)
    assert not (tmp_path / "o").exists()  # refused before any work


def test_a_language_model_needs_eval_text_and_a_fixed_graph_needs_eval_data(llama, tmp_path):
    folder, text = llama
    with pytest.raises(BadInputError, match="needs eval_text"):
        edgekit.deploy(folder, out=tmp_path / "o")
    with pytest.raises(BadInputError, match="needs eval_data"):
        edgekit.deploy(tmp_path / "model.pt2", out=tmp_path / "o")
    with pytest.raises(BadInputError, match="are for a language model"):
        edgekit.deploy(tmp_path / "model.pt2", eval_data=tmp_path / "e.npz", eval_text=text, out=tmp_path / "o")
