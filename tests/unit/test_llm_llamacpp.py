"""llama.cpp as a language-model runtime (issue #37): llama.cpp built from llama-cpp-python 0.3.36's sdist
(edgekit/llm/llama_cpp.py), a transformers folder as GGUF files with a per-tensor account (export_gguf.py), and
the agent's llama.cpp decoder proven against PyTorch. CI runs these in .ci/llama_cpp.sh after the build; without
the build they fail with the command that makes it (a missing runtime must not pass as skipped)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lm_zoo import build_tiny_lm

pytestmark = pytest.mark.llamacpp

CONTEXT = 128
PROMPT = ("This License applies to any program or other work which contains a notice placed by the copyright "
          "holder saying it may be distributed under the terms of this General Public License.")
N_PROMPT = 80  # past 64 rows, where llama.cpp's CPU backend takes another matmul kernel than for a few tokens
# Tolerances, relative to the float logits' largest magnitude (~9 here). f16: f16 weights, and activations
# rounded to f16 in the matmuls (unit roundoff 4.9e-4); a prompt of 64+ rows runs another kernel than a single
# token, and the two differ by up to 2.4e-3 of the scale (measured: 0.022), each within 1.7e-3 of PyTorch; 5e-3
# is twice the widest seen, while a wrong position, mask, RoPE or cache errs by the logits' own order.
F16_REL = 5e-3
# Q8_0: int8 blocks of 32 weights with an f16 scale (up to 1/254 of the block's largest weight) and int8
# activations in the dot products: measured up to 2e-2 of the scale (0.18) against PyTorch and between the
# two kernels; 5e-2, and the greedy choice kept wherever the float model's top-2 gap exceeds twice the error.
Q8_REL = 5e-2


@pytest.fixture(scope="module")
def llama():
    from edgekit.llm.llama_cpp import tools

    return tools()  # no build: LlamaCppMissing names `bash .ci/llama_cpp.sh`, and every test here fails


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_lm("llama")  # hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads, vocab 384


@pytest.fixture(scope="module")
def ggufs(llama, tiny, tmp_path_factory):
    from edgekit.llm.export_gguf import export_gguf

    return export_gguf(tiny, tmp_path_factory.mktemp("gguf"), quants=("Q8_0", "Q4_0", "Q4_K_M"))


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    """The float model's logits for a prompt of held-out text (PyTorch, fp32), and the prompt's ids."""
    import torch
    from lm_zoo import eval_text
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = eval_text(tmp_path_factory.mktemp("text")).read_text(encoding="utf-8")[:2000]
    ids = AutoTokenizer.from_pretrained(tiny)(text)["input_ids"][:N_PROMPT]
    assert len(ids) == N_PROMPT
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    return ids, logits


def decoder(path: Path, **options):
    from edgekit.agent.inprocess import load_agent

    cls = load_agent().runners.decoder_for("llama.cpp")
    return cls.open(str(path), {"threads": 1, "generate": {"context": CONTEXT}, "runtime_options": options})


def _agrees(got: np.ndarray, ref: np.ndarray, err: float) -> None:
    """Greedy choices agree wherever the float model's top-2 gap exceeds twice the error bound."""
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * err
    assert (got.argmax(-1) == ref.argmax(-1))[clear].all()
    assert clear.mean() > 0.5  # the check has positions to check


@pytest.mark.parametrize("file_type,rel", [("F16", F16_REL), ("Q8_0", Q8_REL)])
def test_decoder_logits_match_pytorch_and_the_cache_equals_the_full_forward(ggufs, reference, file_type, rel):
    ids, ref = reference
    dec = decoder(ggufs[file_type].path)
    assert dec.name == "llama.cpp" and dec.version == "0.3.36" and dec.options == {"kv_type": "f16"}
    full = dec.forward(ids, 0)
    assert full.shape == ref.shape and full.dtype == np.float32
    tol = rel * float(np.abs(ref).max())
    err = float(np.abs(full - ref).max())
    print(f"{file_type}: max abs logit diff vs PyTorch {err:.4g} (tolerance {tol:.3g}), top-1 agreement "
          f"{(full.argmax(-1) == ref.argmax(-1)).mean():.3f}")
    assert err <= tol
    _agrees(full, ref, err)
    # token by token through the cache (a new sequence at 0 clears what the prompt left) = the full forward,
    # within the two kernels' difference; below 64 rows they are the same kernel
    steps = np.concatenate([dec.forward([t], i) for i, t in enumerate(ids)])
    cache_err = float(np.abs(steps - full).max())
    short = float(np.abs(dec.forward(ids[:48], 0) - steps[:48]).max())
    print(f"{file_type}: cache vs full forward {cache_err:.4g} ({short:.3g} for 48 tokens)")
    assert dec.length == 48 and cache_err <= tol and short <= tol
    _agrees(steps, ref, float(np.abs(steps - ref).max()))
    # a prompt after a longer sequence begins anew: position 0 is not the old sequence's continuation
    again = dec.forward(ids[:5], 0)
    assert np.abs(again - steps[:5]).max() <= tol and dec.length == 5


def test_decoder_reports_its_kv_cache_and_refuses_what_it_cannot_run(ggufs, tiny, reference):
    import json

    from edgekit.agent.inprocess import load_agent

    agent = load_agent()
    cfg = json.loads((tiny / "config.json").read_text())
    per_token = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * (cfg["hidden_size"]
                                                                            // cfg["num_attention_heads"])
    ids = reference[0]
    sizes = {}
    for kv, nbytes in (("f16", 2), ("f32", 4)):
        dec = decoder(ggufs["F16"].path, kv_type=kv)
        dec.forward(ids[:40], 0)
        sizes[kv] = dec.kv_cache_bytes()
        # the K/V of the 40 cells held, plus llama.cpp's per-cell and per-layer bookkeeping (under 2%)
        assert 40 * per_token * nbytes <= sizes[kv] <= 1.02 * 40 * per_token * nbytes + 512, (kv, sizes)
    assert "llama_state_seq_get_size" in dec.kv_source
    # the runtime is listed (--probe) and refuses a fixed-graph request by name; positions are checked
    assert agent.runners.available_runtimes()["llama.cpp"] == "0.3.36"
    with pytest.raises(agent.protocol.AgentFailure, match="language models only"):
        agent.runners.runner_for("llama.cpp").open(str(ggufs["F16"].path), {"threads": 1})
    with pytest.raises(agent.protocol.AgentFailure, match="does not continue"):
        dec.forward([1], 7)
    with pytest.raises(agent.protocol.AgentFailure, match="exceed"):
        dec.forward([1] * (CONTEXT + 1), 0)
    with pytest.raises(agent.protocol.AgentFailure, match="kv_type"):
        decoder(ggufs["F16"].path, kv_type="q2")
    # a refusal carries llama.cpp's own reason (its C API returns only NULL; the log says why): a q8_0 cache
    # needs heads of whole 32-blocks, and this model's are 16 wide
    with pytest.raises(agent.protocol.AgentFailure, match="does not divide n_embd_head_k=16") as e:
        decoder(ggufs["F16"].path, kv_type="q8_0")
    assert e.value.kind == "model_load_failed"
    bad = ggufs["F16"].path.with_name("not-a-model.gguf")
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(agent.protocol.AgentFailure, match="invalid magic characters") as e:
        decoder(bad)
    assert e.value.kind == "model_load_failed"


def test_generation_workload_runs_on_llama_cpp(ggufs, reference):
    """The agent's generation workload (the one every runtime runs) on the Q8_0 file: per-token times, the
    cache's size from the runtime, teacher-forced scoring."""
    from edgekit.agent.inprocess import load_agent

    agent = load_agent()
    ids = [int(i) for i in reference[0]]
    g = {"context": 64, "prompt_ids": ids, "prompt_lengths": [8, 32], "prefill_repeats": 2, "filled_at": 32,
         "decode_tokens": 8}
    req = {"model": str(ggufs["Q8_0"].path), "runtime": "llama.cpp", "threads": 1, "warmup": 3, "runs": 20,
           "min_seconds": 0.05, "generate": g}
    doc = agent.generation.generate(req)
    assert doc["ok"] and doc["runtime"]["name"] == "llama.cpp" and doc["runtime"]["options"] == {"kv_type": "f16"}
    raw = doc["latency_ms"]["raw"]
    assert len(raw) >= 20 and min(raw) > 0
    print(f"Q8_0 decode: {1000.0 / float(np.median(raw)):.0f} tok/s (median of {len(raw)}, 1 thread)")
    assert doc["memory"]["kv_cache_mb"] > 0 and "llama_state_seq_get_size" in doc["memory"]["kv_cache_source"]
    assert [p["tokens"] for p in doc["generation"]["prefill"]] == [8, 32]


def test_tokenizer_in_the_gguf_splits_text_like_the_model_folder(ggufs, tiny):
    """The converter does not know the zoo tokenizer's pre-tokenizer by hash: edgekit matched it from
    tokenizer.json (GPT-2's byte-level regex) and says so; llama.cpp then tokenizes text as transformers does."""
    from transformers import AutoTokenizer

    from edgekit.agent.inprocess import load_agent

    assert any("'gpt-2' matched from tokenizer.json" in n for n in ggufs["F16"].notes)
    lc = load_agent().runners.llamacpp_runner.import_llama_cpp()
    dec = decoder(ggufs["F16"].path)
    vocab = lc.llama_model_get_vocab(dec.model)
    text = PROMPT + " Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>\n\n  don't 1234"
    buf = (lc.llama_token * 512)()
    n = lc.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, False, False)
    assert list(buf[:n]) == AutoTokenizer.from_pretrained(tiny)(text)["input_ids"]


def test_q4_k_m_account_names_every_fallback_and_why(ggufs, tiny):
    import json

    cfg = json.loads((tiny / "config.json").read_text())
    width, inter = cfg["hidden_size"], cfg["intermediate_size"]
    assert width % 256 and inter % 256 and width % 32 == 0  # 64 and 128: whole Q8_0/Q4_0 blocks, no k-quant ones

    q4k = ggufs["Q4_K_M"]
    acc = {a["name"]: a for a in q4k.account}
    s = q4k.summary
    two_d = {n for n, a in acc.items() if len(a["shape"]) == 2}
    assert q4k.requested == "Q4_K" and s["at_requested"] == 0 and s["tensors"] == len(acc) == 21
    assert set(s["fell_back"]) == two_d  # no k-quant block fits a row: every weight matrix is named
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.1.attn_output.weight", "token_embd.weight"):
        a = acc[name]
        assert a["actual"] == "Q5_0" and a["kind"] == "block", a
        assert f"row width {width} is not a multiple of Q4_K's block size 256" in a["reason"], a
    down = acc["blk.0.ffn_down.weight"]  # its rows are the MLP's width
    assert down["row_width"] == inter and f"row width {inter}" in down["reason"] and down["actual"] == "Q5_0"
    # Q4_K_M gives the last layer's attn_v and ffn_down Q6_K; those fall back to Q8_0, and the account says both
    for name in ("blk.1.attn_v.weight", "blk.1.ffn_down.weight"):
        assert acc[name]["actual"] == "Q8_0" and "want Q6_K" in acc[name]["reason"], acc[name]
    out = acc["output.weight"]
    assert out["kind"] == "rule" and out["actual"] == "Q8_0" and "output layer" in out["reason"]
    norms = s["not_requested"]["float_1d"]
    assert len(norms) == 5 and all(acc[n]["actual"] == "F32" and "1-D" in acc[n]["reason"] for n in norms)
    assert s["types"] == {"F32": 5, "Q5_0": 13, "Q8_0": 3}

    # Q8_0 and Q4_0 fit width 64: every matrix at the requested type but Q4_0's output layer (Q6_K by rule,
    # which falls back to Q8_0), only the norms float
    q8, q40 = ggufs["Q8_0"].summary, ggufs["Q4_0"].summary
    assert q8["fell_back"] == [] and q8["at_requested"] == 16 and set(q8["not_requested"]) == {"float_1d"}
    assert q40["fell_back"] == ["output.weight"] and q40["at_requested"] == 15
    assert ggufs["F16"].summary["types"] == {"F16": 16, "F32": 5}
    sizes = {k: f.path.stat().st_size for k, f in ggufs.items()}
    assert sizes["Q4_0"] < sizes["Q4_K_M"] < sizes["Q8_0"] < sizes["F16"]
    step = q4k.step()
    assert step.name == "quantize (llama.cpp Q4_K_M)" and step.metrics["quantization"] == s


def test_the_other_family_qwen2(llama, reference, tmp_path):
    """Qwen2: tied embeddings (no output.weight in the file), q/k/v biases (1-D, kept float), its own
    pre-tokenizer (matched as 'qwen2'); the f16 file's logits match PyTorch as Llama's do."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgekit.llm.export_gguf import export_gguf

    folder = build_tiny_lm("qwen2")
    files = export_gguf(folder, tmp_path, quants=("Q4_K_M",))
    assert any("'qwen2' matched from tokenizer.json" in n for n in files["F16"].notes)
    acc = {a["name"]: a for a in files["Q4_K_M"].account}
    assert "output.weight" not in acc and acc["token_embd.weight"]["kind"] in ("rule", "block")
    assert acc["blk.0.attn_q.bias"]["kind"] == "float_1d" and acc["blk.0.attn_q.bias"]["actual"] == "F32"
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT * 3)["input_ids"][:N_PROMPT]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    got = decoder(files["F16"].path).forward(ids, 0)
    assert np.abs(got - ref).max() <= F16_REL * np.abs(ref).max()
    _agrees(got, ref, float(np.abs(got - ref).max()))


def test_a_gpt2_saved_by_current_transformers_converts(llama, tiny, tmp_path):
    """A user's GPT-2 (the family of distilgpt2 and most fine-tunes) saved by a current transformers has no n_ctx
    in config.json, which llama.cpp's GPT-2 converter reads: every GGUF variant was dropped at build with a
    KeyError (found deploying such a model as a user types it). The context length comes from n_positions, the
    note says so, and the f16 file's logits match PyTorch."""
    import json

    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from edgekit.llm.export_gguf import export_gguf

    torch.manual_seed(0)
    folder = tmp_path / "gpt2"
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=384, n_positions=128)).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny, local_files_only=True).save_pretrained(folder)
    assert "n_ctx" not in json.loads((folder / "config.json").read_text())  # what the converter used to need
    files = export_gguf(folder, tmp_path / "out", quants=("Q8_0",))
    assert any("n_positions" in n for n in files["F16"].notes), files["F16"].notes
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT * 3)["input_ids"][:N_PROMPT]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    got = decoder(files["F16"].path).forward(ids, 0)
    assert np.abs(got - ref).max() <= F16_REL * np.abs(ref).max()
    _agrees(got, ref, float(np.abs(got - ref).max()))


def test_width_not_a_multiple_of_32_falls_back_to_f16_and_says_so(llama, tmp_path):
    """At width 48 not even a 32-block fits: llama-quantize writes those matrices as F16, named with why."""
    from edgekit.llm.export_gguf import export_gguf

    files = export_gguf(build_tiny_lm("llama", hidden=48), tmp_path, quants=("Q8_0",))
    acc = {a["name"]: a for a in files["Q8_0"].account}
    q = acc["blk.0.attn_q.weight"]
    assert q["actual"] == "F16" and "row width 48 is not a multiple of Q8_0's block size 32" in q["reason"]
    assert acc["blk.0.ffn_down.weight"]["actual"] == "Q8_0"  # its rows are 96 wide: three blocks


def test_importance_matrix_from_a_calibration_text(llama, tiny, tmp_path):
    """Off by default; given a text, llama-imatrix computes the matrix and llama-quantize uses it."""
    from lm_zoo import eval_text

    from edgekit.llm.export_gguf import export_gguf

    files = export_gguf(tiny, tmp_path, quants=("Q4_0",), imatrix_text=eval_text(tmp_path / "t"),
                        imatrix_context=64)
    q = files["Q4_0"]
    assert q.imatrix == str(tmp_path / "model-imatrix.gguf") and Path(q.imatrix).stat().st_size > 0
    assert q.step().config["imatrix"] == q.imatrix and q.summary["at_requested"] == 15


def test_an_architecture_the_converter_does_not_know_is_refused_by_name(llama, tiny, tmp_path):
    import json
    import shutil

    from edgekit.errors import ConversionError
    from edgekit.llm.export_gguf import convert_to_gguf

    folder = tmp_path / "m"
    shutil.copytree(tiny, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["FooBarForCausalLM"]}))
    with pytest.raises(ConversionError, match="does not support the architecture FooBarForCausalLM") as e:
        convert_to_gguf(folder, tmp_path / "out" / "m.gguf")
    assert e.value.exit_code == 2 and "llama.cpp converts" in e.value.hint
    assert list((tmp_path / "out").iterdir()) == []  # no partial file


def test_missing_build_fails_with_the_install_command(monkeypatch, tmp_path, tiny):
    from edgekit.errors import MissingExtraError
    from edgekit.llm.export_gguf import export_gguf
    from edgekit.llm.llama_cpp import INSTALL, LlamaCppMissing, tools

    monkeypatch.setenv("EDGEKIT_LLAMA_CPP_DIR", str(tmp_path / "none"))
    with pytest.raises(LlamaCppMissing) as e:
        tools()
    assert isinstance(e.value, MissingExtraError) and e.value.exit_code == 2
    assert e.value.hint == INSTALL == "bash .ci/llama_cpp.sh" and "not built" in str(e.value)
    with pytest.raises(LlamaCppMissing):
        export_gguf(tiny, tmp_path / "out")
    assert not (tmp_path / "out" / "model-f16.gguf").exists()
    # a half build (no build.json, written last) is never taken for a build
    from edgekit.llm.llama_cpp import build_dir

    (build_dir() / "bin").mkdir(parents=True)
    with pytest.raises(LlamaCppMissing, match="incomplete.*build.json"):
        tools()


def test_agent_without_the_library_says_what_is_missing(monkeypatch, tmp_path, ggufs):
    from edgekit.agent.inprocess import load_agent

    agent = load_agent()
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    version, why = agent.runners.RUNNERS["llama.cpp"].probe()
    assert version is None and "holds no libllama.so" in why
    with pytest.raises(agent.protocol.AgentFailure, match="not usable on this device") as e:
        decoder(ggufs["F16"].path)
    assert e.value.kind == "runtime_missing"


def test_a_build_made_elsewhere_or_otherwise_is_not_taken(monkeypatch, tmp_path):
    """tools() takes only a build configured as this edgekit configures one, made on a CPU with this one's
    features (-march=native): a stale or foreign build asks to be rebuilt instead of dying on SIGILL."""
    import json

    from edgekit.llm import llama_cpp as lcpp

    monkeypatch.setenv("EDGEKIT_LLAMA_CPP_DIR", str(tmp_path))
    root = lcpp.build_dir()
    for rel in [*(f"bin/{t}" for t in lcpp.TOOLS), *(f"lib/lib{n}.so" for n in lcpp.LIBS), "convert_hf_to_gguf.py",
                "conversion/__init__.py", "gguf-py/gguf/__init__.py"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    info = {"cmake_args": lcpp.cmake_args(), "cpu_features": lcpp.cpu_features()}
    (root / "build.json").write_text(json.dumps(info))
    assert lcpp.tools().root == root
    (root / "build.json").write_text(json.dumps({**info, "cmake_args": ["-DGGML_NATIVE=ON"]}))
    with pytest.raises(lcpp.LlamaCppMissing, match="stale"):
        lcpp.tools()
    (root / "build.json").write_text(json.dumps({**info, "cpu_features": "0123456789abcdef"}))
    with pytest.raises(lcpp.LlamaCppMissing, match="another CPU"):
        lcpp.tools()


FAKE_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
foreach(n ggml ggml-base ggml-cpu)
  add_library(${n} SHARED lib.c)
endforeach()
add_library(llama SHARED lib.c)
target_link_libraries(llama ggml ggml-base ggml-cpu)
foreach(t llama-quantize llama-bench llama-perplexity llama-imatrix)
  add_executable(${t} main.c)
  target_link_libraries(${t} llama)
endforeach()
"""


def _fake_sdist(path: Path, lib_c: str) -> Path:
    """An sdist shaped like llama-cpp-python's, its vendor/llama.cpp a project of seconds (same targets)."""
    import io
    import tarfile

    from edgekit.llm.llama_cpp import VERSION

    files = {"CMakeLists.txt": FAKE_CMAKE, "lib.c": lib_c, "main.c": "int answer(void);\nint main(void) "
             "{ return answer() == 42 ? 0 : 1; }\n", "convert_hf_to_gguf.py": "", "conversion/__init__.py": "",
             "gguf-py/gguf/__init__.py": ""}
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{VERSION}/vendor/llama.cpp/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_build_is_atomic_cached_and_its_tools_run_from_the_cache(monkeypatch, tmp_path):
    import subprocess

    from edgekit.errors import EdgekitError
    from edgekit.llm import llama_cpp as lcpp

    monkeypatch.setenv("EDGEKIT_LLAMA_CPP_DIR", str(tmp_path / "cache"))
    said: list[str] = []
    good = _fake_sdist(tmp_path / "good.tar.gz", "int answer(void) { return 42; }\n")
    t = lcpp.ensure_built(good, jobs=1, say=said.append)
    assert t.root == lcpp.build_dir() and t.info()["cmake_args"] == lcpp.cmake_args()
    assert said[-1].startswith(f"llama.cpp {lcpp.VERSION}: built in ")
    # the tools were copied out of the build tree and find their libraries from there (rpath $ORIGIN/../lib)
    assert subprocess.run([str(t.quantize)]).returncode == 0
    stamp = (t.root / "build.json").stat().st_mtime_ns
    assert lcpp.ensure_built(good, say=said.append).root == t.root and "cached build" in said[-1]
    assert (t.root / "build.json").stat().st_mtime_ns == stamp
    # a failed rebuild leaves the complete build as it was and no half build beside it
    bad = _fake_sdist(tmp_path / "bad.tar.gz", "int answer(void) { return 42 }\n")
    with pytest.raises(EdgekitError, match="building llama.cpp failed") as e:
        lcpp.ensure_built(bad, jobs=1, rebuild=True, say=said.append)
    assert "expected" in str(e.value)  # the compiler's own message, from the log's tail
    assert lcpp.tools().root == t.root and (t.root / "build.json").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in lcpp.cache_root().iterdir()) == [".lock", t.root.name]


def test_llama_cpp_races_onnxruntime_in_the_deploy_loop(llama, tiny, tmp_path, cli):
    """The GGUF files as variants of `edgekit deploy MODEL_DIR --eval-text`: each proven against PyTorch at
    build (the cache through llama.cpp's own kernels), measured by the agent's llama.cpp decoder beside
    onnxruntime, its quality from its own logits, the tensors llama-quantize kept at other types named in
    report.md; `edgekit run` reproduces the shipped file's perplexity."""
    import json

    from lm_zoo import eval_text

    text = eval_text(tmp_path / "t")
    names = ("ort-int8", "gguf-q8_0", "gguf-q4_0", "gguf-q4_k_m")
    r = cli("deploy", str(tiny), "--eval-text", str(text), "--context", "96", "--lm-variants", ",".join(names),
            "--runs", "30", "--warmup", "3", "--min-seconds", "0.2", "--threads", "1", "--out", str(tmp_path / "o"),
            "--json")
    assert r.exit_code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    got = {v["name"]: v for v in rep["variants"]}
    assert set(got) == set(names), rep["decision"]
    for n in names[1:]:
        v = got[n]
        assert v["format"] == "gguf" and v["runtime"]["name"] == "llama.cpp", v["runtime"]
        assert v["generation"]["decode_tokens_per_s"] > 0 and v["generation"]["kv_cache_mb"] > 0
        par = v["lineage"][-1]["metrics"]["cache_parity"]
        assert par["cache_vs_pytorch_max_abs_err"] <= par["prefill_max_abs_err"] * 1.5 + par["tolerance"], par
    # 8 bits beside 4: the quality order the formats promise, measured from the device's own logits
    kld = {n: got[n]["quality"]["kld_mean"] for n in names[1:]}
    assert kld["gguf-q8_0"] < kld["gguf-q4_k_m"] < kld["gguf-q4_0"] < 0.05, kld
    md = (tmp_path / "o" / "report.md").read_text()
    assert "**`gguf-q4_0`** tensors (asked Q4_0)" in md
    assert "`output.weight` at Q8_0: the Q4_0 rules want Q6_K for it; its row width 64" in md
    shipped = rep["decision"]["ship"]
    r2 = cli("run", str(tmp_path / "o" / "ship"), "--eval-text", str(text), "--json")
    assert r2.exit_code == 0, r2.stdout[-2000:] + r2.stderr[-2000:]
    again = json.loads(r2.stdout)
    assert again["perplexity"] == pytest.approx(got[shipped]["quality"]["perplexity"], rel=1e-3), again
