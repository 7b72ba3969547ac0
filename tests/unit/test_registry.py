"""The format/runtime registry (edgekit/formats.py) is the one table: the derived views keep their
meaning, every row's named hop/config/loader resolves, every device runtime has an agent runner,
the hop dispatcher chains hops from the rows, and the TorchPass base sets torch threads."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.artifact import Artifact, IOSpec, LineageStep, TensorSpec
from edgekit.errors import BadInputError, ConversionError
from edgekit.formats import (
    FORMATS,
    RUNTIME_FOR_FORMAT,
    SUFFIXES,
    Format,
    all_precisions,
    convert_targets,
    detect_format,
    format_spec,
    spec_for_runtime,
)


def test_one_row_per_format_and_the_derived_views():
    assert [r.format for r in FORMATS] == list(Format)
    legacy = {".pt2": Format.TORCH, ".onnx": Format.ONNX, ".tflite": Format.TFLITE,
              ".mlpackage": Format.COREML, ".mlmodel": Format.COREML}
    assert SUFFIXES.items() >= legacy.items()
    assert SUFFIXES == {sfx: r.format for r in FORMATS for sfx in r.suffixes}
    legacy_rt = {Format.ONNX: "onnxruntime", Format.TFLITE: "litert", Format.COREML: "coreml"}
    assert RUNTIME_FOR_FORMAT.items() >= legacy_rt.items()
    assert RUNTIME_FOR_FORMAT == {r.format: r.runtime for r in FORMATS if r.runtime}
    for row in FORMATS:
        assert format_spec(row.format) is row is format_spec(row.format.value)
        for sfx in row.suffixes:
            assert detect_format(f"m{sfx.upper()}") == row.format
        if row.runtime:
            assert spec_for_runtime(row.runtime) is row
    assert spec_for_runtime("no-such-runtime") is None
    assert convert_targets()[:3] == ("onnx", "tflite", "coreml")
    assert convert_targets() == tuple(r.format.value for r in FORMATS if r.hop)


def test_named_hops_configs_and_loaders_resolve():
    from edgekit.convert.hops import load_object

    for row in FORMATS:
        for target in (row.hop, row.source_loader, row.hop_config):
            if target:
                assert callable(load_object(target)), target
        if row.hop:
            assert row.hop_from is not None and row.precisions and row.suffix.startswith(".")
        if row.hop_config:  # the hop's options are fields of its config
            fields = load_object(row.hop_config).model_fields
            assert "precision" in fields and all(o in fields for o in row.options)


def test_every_device_runtime_has_an_agent_runner():
    from edgekit.agent.inprocess import load_agent

    runners = load_agent().runners.RUNNERS
    for row in FORMATS:
        if row.runtime and row.agent_runs:
            assert row.runtime in runners, f"{row.format.value}: no runner {row.runtime!r} in the agent"


def test_candidates_are_valid_recipe_steps():
    from edgekit.inputs.recipe import PassStep
    from edgekit.pass_names import known_passes
    from edgekit.passes.convert import ConvertConfig

    for row in FORMATS:
        for cand in (*row.default_variants, *row.search_candidates):
            for name, cfg in cand.passes:
                assert name in known_passes()
                PassStep(name=name, config=cfg)
                if name == "convert":
                    assert ConvertConfig(**cfg).to == row.format.value
                    if cand.without_calib:
                        ConvertConfig(**{**cfg, **cand.without_calib})


def test_convert_step_and_cli_take_the_registry_targets():
    from typing import get_args

    from edgekit.cli.convert import Precision, To
    from edgekit.passes.convert import ConvertConfig

    assert get_args(ConvertConfig.model_fields["to"].annotation) == convert_targets()
    assert tuple(t.value for t in To) == convert_targets()
    assert tuple(p.value for p in Precision) == all_precisions()


def test_search_candidates_come_from_the_rows():
    from edgekit.inputs.targets import load_target
    from edgekit.variant_search.candidates import candidate_variants

    got, skipped = candidate_variants(load_target("rpi4"), has_calib=True)
    rows = [c for r in load_target("rpi4").runtimes for c in spec_for_runtime(r).search_candidates]
    # in the rows' order, the open-ended searches (the accuracy-aware ladder) after every single-shot one
    want = [c.name for c in rows if not c.open_ended] + [c.name for c in rows if c.open_ended]
    assert [v.name for v in got] == want and not skipped
    assert got[-1].name == "ort-int8-mixed" and any(c.name == "ort-int8-mixed" for c in rows[:-1])
    got, skipped = candidate_variants(load_target("iphone-coreml"), has_calib=True)
    assert got == [] and skipped == [("coreml", "profiling coreml needs its own host (e.g. Core ML needs macOS)")]



def test_the_language_model_race_comes_from_the_same_rows(monkeypatch):
    """One candidate table for both workloads: a language model's files are the registry rows'
    ``generation_candidates``, each raced by its format's runtime, and a row added there races."""
    import dataclasses

    from edgekit import formats
    from edgekit.formats import GenerationCandidate
    from edgekit.llm import candidates

    rows = [(g.name, s.runtime) for s in FORMATS for g in s.generation_candidates]
    assert [(c.name, c.runtime) for c in candidates.CANDIDATES] == rows
    assert set(candidates.SHORT) == {g.name for s in FORMATS for g in s.generation_candidates if g.quick}
    assert candidates.BASELINE == "ort-fp32" and candidates.BASELINE in candidates.SHORT
    assert {s.format for s in FORMATS if s.generation_candidates} == {Format.ONNX, Format.EXECUTORCH, Format.GGUF}
    onnx = format_spec(Format.ONNX)
    extra = GenerationCandidate("ort-int4-b64", "int4", "edgekit.llm.candidates:ort_int4", (64,), calibrated=True)
    patched = tuple(dataclasses.replace(s, generation_candidates=(*s.generation_candidates, extra))
                    if s is onnx else s for s in FORMATS)
    monkeypatch.setattr(formats, "FORMATS", patched)
    monkeypatch.setattr(candidates, "FORMATS", patched)
    new = {c.name: c for c in candidates._from_registry()}
    assert new["ort-int4-b64"].runtime == "onnxruntime" and new["ort-int4-b64"].calibrated and callable(
        new["ort-int4-b64"].build)

def test_a_target_adds_its_likely_winners_to_the_short_search(tmp_path, monkeypatch):
    from edgekit.errors import ConfigError
    from edgekit.inputs.targets import load_target
    from edgekit.variant_search.candidates import candidate_variants

    def quick(name):
        got, skipped = candidate_variants(load_target(name), has_calib=True, quick=True)
        return [v.name for v in got], dict(skipped)

    registry_quick = [c.name for r in load_target("rpi5").runtimes for c in spec_for_runtime(r).search_candidates
                      if c.quick]
    rpi5, rpi5_skipped = quick("rpi5")
    # the Pi 5's short search races OpenVINO and NCNN (its two fastest runtimes in the published figures)
    assert {"openvino-auto", "openvino-int8", "ncnn-fp16"} <= set(rpi5) and set(registry_quick) <= set(rpi5)
    assert "openvino-fp32" in rpi5_skipped and "ncnn-fp32" in rpi5_skipped
    from edgekit.variant_search import candidates

    # x86 without native bf16: OpenVINO's default precision is f32 there, and it does not start in the short search
    monkeypatch.setattr(candidates, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_vnni"})
    local, local_skipped = quick("local")
    assert "openvino-auto" not in local and "openvino-auto" in local_skipped
    # with AMX or AVX-512 BF16 its bf16 wins on the pretrained OCR detector (2.3x fp32 on a Xeon with AMX, 2.8x on an
    # EPYC with AVX-512 BF16, against the short search's best at 1.5x and 1.9x): in from the start, on the local
    # target only (a board's own file names its winners)
    for flags in ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}):
        monkeypatch.setattr(candidates, "cpu_flags", lambda flags=flags: flags)
        local, _ = quick("local")
        assert "openvino-auto" in local and "openvino-int8" not in local, (flags, local)
    assert "openvino-auto" not in quick("rpi4")[0] and "openvino-fp32" not in quick("rpi5")[0]
    # a name that is no candidate of the target's runtimes is refused when the file is read, naming it
    bad = (Path(__file__).parents[2] / "targets" / "rpi4.yaml").read_text() + "short_search: [executorch-fp32]\n"
    (tmp_path / "pi4x.yaml").write_text(bad.replace("name: rpi4", "name: pi4x"))
    with pytest.raises(ConfigError, match=r"short_search names \[.executorch-fp32.\]"):
        load_target(tmp_path / "pi4x.yaml")


# --------------------------------------------------------------------------- the hop dispatcher
def _art(tmp_path: Path, fmt: Format, name: str, violations=()) -> Artifact:
    p = tmp_path / name
    p.write_bytes(name.encode())
    io = IOSpec(inputs=(TensorSpec(name="x", shape=(1, 4), dtype="float32"),),
                outputs=(TensorSpec(name="y", shape=(1, 4), dtype="float32"),))
    step = LineageStep(kind="convert", name=f"->{fmt.value}", metrics={"parity_violations": list(violations)})
    return Artifact.from_file(p, fmt, io, lineage=[step])


@pytest.fixture
def fake_hops(monkeypatch, tmp_path):
    """The real rows with fake hop functions: records which hop ran on what."""
    from edgekit.convert import hops

    calls = []
    real = hops.load_object
    bad_onnx = {"on": False}

    def fake(target):
        row = next((r for r in FORMATS if r.hop == target), None)
        if row is None:
            return real(target)

        def hop(h):
            calls.append((row.format, h.artifact.format, h.out, h.precision, type(h.config).__name__))
            return _art(tmp_path, row.format, h.out.name,
                        ["max|err| too big"] if bad_onnx["on"] and row.format == Format.ONNX else [])
        return hop

    monkeypatch.setattr(hops, "load_object", fake)
    return calls, bad_onnx


def test_convert_to_chains_the_hop_before(fake_hops, tmp_path):
    from edgekit.convert.hops import convert_to

    calls, _ = fake_hops
    src = _art(tmp_path, Format.TORCH, "m.pt2")
    work = tmp_path / "work"
    work.mkdir()
    art = convert_to(src, "tflite", tmp_path / "m.tflite", precision="fp16", workdir=work)
    assert art.format == Format.TFLITE
    assert calls == [(Format.ONNX, Format.TORCH, work / "model.onnx", "fp32", "NoneType"),
                     (Format.TFLITE, Format.ONNX, tmp_path / "m.tflite", "fp16", "TfliteConfig")]
    calls.clear()
    onnx = _art(tmp_path, Format.ONNX, "m.onnx")
    assert convert_to(onnx, Format.ONNX, tmp_path / "x.onnx") is onnx and calls == []  # already there
    convert_to(onnx, "coreml", tmp_path / "m.mlpackage", precision="int8")  # Core ML reads the program
    assert calls == [(Format.COREML, Format.ONNX, tmp_path / "m.mlpackage", "int8", "CoremlConfig")]


def test_an_intermediate_hop_out_of_tolerance_stops_the_chain(fake_hops, tmp_path):
    from edgekit.convert.hops import convert_to

    calls, bad = fake_hops
    bad["on"] = True
    with pytest.raises(ConversionError, match="ONNX conversion is out of parity tolerance: max.err. too big"):
        convert_to(_art(tmp_path, Format.TORCH, "m.pt2"), "tflite", tmp_path / "m.tflite")
    assert [c[0] for c in calls] == [Format.ONNX]


def test_unknown_targets_are_refused():
    from edgekit.convert.hops import target_spec

    for bad in ("jpeg", "torch"):
        with pytest.raises(BadInputError, match="onnx, tflite, coreml"):
            target_spec(bad)


# --------------------------------------------------------------------------- TorchPass
def test_torch_pass_runs_with_the_configs_threads(tmp_path):
    import torch
    from pydantic import BaseModel

    from edgekit.passes.base import PassContext, PassOutput, TorchPass

    seen = []

    class Cfg(BaseModel):
        threads: int | None = 1

    class Probe(TorchPass):
        name = "probe"
        Config = Cfg

        def run_torch(self, artifact, config, ctx, stem):
            seen.append(torch.get_num_threads())
            out = ctx.workdir / f"{stem}.pt2"
            out.write_bytes(b"x")
            return PassOutput(path=out, precision="fp32", fmt=Format.TORCH)

    before = torch.get_num_threads()
    n = 3 if before != 3 else 2
    art = _art(tmp_path, Format.TORCH, "m.pt2")
    Probe()(art, {"threads": n}, PassContext(workdir=tmp_path / "w"))
    Probe()(art, {"threads": None}, PassContext(workdir=tmp_path / "w"))
    assert seen == [n, before] and torch.get_num_threads() == before
    with pytest.raises(Exception, match="takes"):
        Probe()(_art(tmp_path, Format.ONNX, "m.onnx"), {}, PassContext(workdir=tmp_path / "w"))
