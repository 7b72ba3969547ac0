"""A GGUF file as a language-model source: the safe pre-check and the conversion to a float folder.

The round trip proves the conversion exact (a tiny random Llama -> llama.cpp-layout GGUF -> folder gives
the original logits), and a negative control proves the comparison would catch a q/k permutation left
undone. Every hostile file must be refused by name, quickly, before anything trusts its counts.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from edgekit.errors import ModelLoadError, OutputError
from edgekit.llm.gguf_source import GGUFInfo, check_gguf, gguf_to_folder, supported_architectures
from tests.gguf_fixtures import (
    CHAT_TEMPLATE,
    SENTENCE,
    build_tiny_llama,
    gguf_layout,
    patched,
    quantization_roundtrip,
    tiny_llama_gguf,
    train_tokenizer,
    truncated,
    write_llama_gguf,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The original model and tokenizer, and their GGUF (built once: the file is read-only in tests)."""
    d = tmp_path_factory.mktemp("gguf")
    tok = train_tokenizer()
    model = build_tiny_llama(tok.get_vocab_size())
    path = write_llama_gguf(model, tok, d / "tiny-llama.gguf")
    return model, tok, path


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
    _, _, path = tiny
    dest = tmp_path_factory.mktemp("out") / "tiny-llama"
    t0 = time.perf_counter()
    out = gguf_to_folder(path, dest)
    return out, time.perf_counter() - t0


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


# --- check_gguf on a good file -------------------------------------------------------------------
def test_check_gguf_describes_a_good_file(tiny):
    model, tok, path = tiny
    t0 = time.perf_counter()
    info = check_gguf(path)
    assert time.perf_counter() - t0 < 2
    assert isinstance(info, GGUFInfo)
    assert info.version == 3
    assert info.architecture == "llama"
    assert info.name == "tiny-llama"
    assert info.tensor_count == 3 + 9 * model.config.num_hidden_layers
    assert info.quantization_types == {"F32": info.tensor_count}
    assert not info.is_quantized
    assert info.context_length == model.config.max_position_embeddings
    assert info.vocab_size == tok.get_vocab_size() == model.config.vocab_size
    assert info.has_chat_template
    assert info.file_size == path.stat().st_size
    import hashlib

    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.kv_count >= 20


def test_check_gguf_never_calls_gguf_reader(tiny, monkeypatch):
    """The pre-check is its own bounded walk: GGUFReader trusts counts and must not see a file first."""
    import gguf

    def refuse(*a, **k):
        raise AssertionError("check_gguf must not use GGUFReader")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    monkeypatch.setattr(gguf.gguf_reader, "GGUFReader", refuse)
    check_gguf(tiny[2])


def test_supported_architectures_lists_llama_not_t5():
    archs = supported_architectures()
    assert "llama" in archs and "qwen2" in archs and "qwen2moe" in archs  # llama.cpp's spelling
    for absent in ("t5", "deci", "general", "tokenizer", "qwen2_moe"):
        assert absent not in archs


def test_importing_the_module_is_cheap():
    import subprocess
    import sys

    code = ("import sys, edgekit.llm.gguf_source; "
            "print(sorted(m for m in ('torch', 'transformers', 'gguf', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the round trip ------------------------------------------------------------------------------
def test_round_trip_logits_equal_the_original(tiny, converted):
    from transformers import AutoModelForCausalLM

    model, tok, _ = tiny
    out, seconds = converted
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "edgekit_source.json"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config  # a plain float model, no GGUF quantizer left on it
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert getattr(reloaded, "hf_quantizer", None) is None
    assert all(p.dtype == torch.float32 for p in reloaded.parameters())
    ids = tok.encode(SENTENCE).ids
    a, b = _logits(model, ids), _logits(reloaded, ids)
    assert a.shape == b.shape == (1, len(ids), model.config.vocab_size)
    assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
    assert a.abs().max() > 1  # the logits are not near-constant: the comparison has teeth
    assert seconds < 30


def test_negative_control_unpermuted_qk_changes_logits(tiny, tmp_path):
    """Writing q/k without llama.cpp's rotary permutation must break parity: the round trip's equality
    is evidence that the permutation is undone, not that it does not matter for this model."""
    from transformers import AutoModelForCausalLM

    model, tok, _ = tiny
    bad = write_llama_gguf(model, tok, tmp_path / "noperm.gguf", permute_qk=False)
    m = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=bad.name, local_files_only=True).eval()
    ids = tok.encode(SENTENCE).ids
    assert (_logits(model, ids) - _logits(m, ids)).abs().max() > 1e-2


def test_quantized_gguf_is_dequantized_exactly(tiny, tmp_path):
    """A Q8_0 file: the folder holds exactly the dequantized blocks, and says what they were."""
    from transformers import AutoModelForCausalLM

    model, tok, _ = tiny
    q8 = write_llama_gguf(model, tok, tmp_path / "q8.gguf", quantize="Q8_0")
    info = check_gguf(q8)
    assert info.is_quantized and info.quantization_types == {"F32": 5, "Q8_0": 16}
    out = gguf_to_folder(q8, tmp_path / "q8")
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert all(p.dtype == torch.float32 for p in reloaded.parameters())
    ids = tok.encode(SENTENCE).ids
    expected = _logits(quantization_roundtrip(model, "Q8_0"), ids)
    got = _logits(reloaded, ids)
    assert torch.allclose(expected, got, atol=1e-4, rtol=0), (expected - got).abs().max()
    assert (got - _logits(model, ids)).abs().max() > 1e-4  # the weights really were quantized
    record = json.loads((out / "edgekit_source.json").read_text())
    assert record["dequantized_from"] == {"F32": 5, "Q8_0": 16}


def test_round_trip_tokenizer_and_chat_template(tiny, converted):
    from transformers import AutoTokenizer

    _, tok, _ = tiny
    out, _ = converted
    t = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = t(SENTENCE, add_special_tokens=False)["input_ids"]
    assert ids == tok.encode(SENTENCE).ids
    assert t.decode(ids) == SENTENCE
    assert len(t) == tok.get_vocab_size()
    assert t.chat_template == CHAT_TEMPLATE
    text = t.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.eos_token == "<|endoftext|>"
    # the chat markers stay whole: one id each, not split into bytes
    assert len(t("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1


def test_round_trip_records_the_source(tiny, converted):
    _, _, path = tiny
    out, _ = converted
    record = json.loads((out / "edgekit_source.json").read_text())
    info = check_gguf(path)
    assert record["sha256"] == info.sha256
    assert record["gguf_path"] == str(path.resolve())
    assert record["gguf"]["architecture"] == "llama"
    assert record["gguf"]["vocab_size"] == info.vocab_size
    assert record["gguf"]["has_chat_template"] is True
    assert record["dequantized_from"] == {"F32": info.tensor_count}
    # nothing half-written is left beside the output
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_tied_embeddings_round_trip(tiny, tmp_path):
    """llama.cpp writes no output.weight for a tied model (Llama 3.2 1B, Qwen2.5 0.5B, ...)."""
    from transformers import AutoModelForCausalLM

    _, tok, _ = tiny
    model = build_tiny_llama(tok.get_vocab_size(), seed=1, tie_word_embeddings=True)
    path = write_llama_gguf(model, tok, tmp_path / "tied.gguf")
    assert check_gguf(path).tensor_count == 2 + 9 * model.config.num_hidden_layers
    out = gguf_to_folder(path, tmp_path / "tied")
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert reloaded.config.tie_word_embeddings
    ids = tok.encode(SENTENCE).ids
    assert torch.allclose(_logits(model, ids), _logits(reloaded, ids), atol=1e-4, rtol=0)


def test_conversion_replaces_its_own_output_but_not_other_folders(tiny, tmp_path):
    _, _, path = tiny
    dest = tmp_path / "again"
    gguf_to_folder(path, dest)
    (dest / "stale.txt").write_text("from an earlier run")
    gguf_to_folder(path, dest)  # an earlier conversion is replaced whole
    assert not (dest / "stale.txt").exists() and (dest / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no .old / .tmp folders left
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError):
        gguf_to_folder(path, other)
    assert (other / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "mine"]


def test_tiny_llama_gguf_helper(tmp_path):
    path = tiny_llama_gguf(tmp_path)
    assert path.suffix == ".gguf" and check_gguf(path).architecture == "llama"


# --- refusals by gguf_to_folder ------------------------------------------------------------------
def test_tokenizer_larger_than_the_model_is_refused(tiny, tmp_path):
    model, tok, _ = tiny
    bad = write_llama_gguf(model, tok, tmp_path / "extra.gguf", extra_tokens=8)
    dest = tmp_path / "out"
    with pytest.raises(ModelLoadError) as e:
        gguf_to_folder(bad, dest)
    msg = str(e.value)
    n = model.config.vocab_size
    assert str(n + 8) in msg and str(n) in msg and "extra.gguf" in msg
    assert e.value.exit_code == 2 and e.value.hint
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["extra.gguf"]  # no temp folder left behind


def test_unsupported_architecture_is_refused_by_name(tiny, tmp_path):
    model, tok, _ = tiny
    bad = write_llama_gguf(model, tok, tmp_path / "rwkv.gguf", arch="rwkv6")
    with pytest.raises(ModelLoadError) as e:
        gguf_to_folder(bad, tmp_path / "out")
    msg = str(e.value)
    assert "'rwkv6'" in msg and "llama" in msg and "rwkv.gguf" in msg
    assert not (tmp_path / "out").exists()


# --- hostile files -------------------------------------------------------------------------------
def _refused(path: Path, *phrases: str) -> ModelLoadError:
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as e:
        check_gguf(path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2, f"took {elapsed:.2f}s"
    msg = e.value.message
    assert str(path) in msg, msg
    # the phrases must be in what the message says, not in the path (tmp_path holds the test's name)
    said = msg.replace(str(path), "<file>")
    for phrase in phrases:
        assert phrase in said, f"{phrase!r} not in {said!r}"
    assert e.value.hint and e.value.exit_code == 2
    return e.value


def test_wrong_magic(tiny, tmp_path):
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + tiny[2].read_bytes()[4:])
    _refused(bad, "wrong magic", "b'GGML'")


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _refused(empty, "empty")
    _refused(tmp_path / "nowhere.gguf", "does not exist")


@pytest.mark.parametrize("version, phrase", [(1, "unsupported GGUF version 1"), (99, "unsupported GGUF version 99"),
                                             (0x03000000, "big-endian")])
def test_unsupported_version(tiny, tmp_path, version, phrase):
    bad = patched(tiny[2], tmp_path / f"v{version}.gguf", 4, "<I", version)
    _refused(bad, phrase)


def test_truncated_anywhere(tiny, tmp_path):
    path = tiny[2]
    size = path.stat().st_size
    lay = gguf_layout(path)
    cuts = {  # where the file is cut -> what the message must say besides "truncated"
        "mid-magic": (2, "magic"),
        "mid-header": (13, "tensor count in the header"),
        "end-of-header": (24, "the header claims"),
        # so early that the tensor table the header announces cannot fit in what is there
        "mid-metadata": (lay["arch_value"] + 10, "the header claims 21 tensors"),
        "mid-token-list": ((lay["metadata"] + lay["tensor_infos"]) // 2, "tokenizer.ggml.tokens"),
        "mid-tensor-infos": (lay["tensor_infos"] + 40, "token_embd.weight"),
        "mid-tensor-data": (size - 100, "past the end of the file"),
        "one-byte-short": (size - 1, "past the end of the file"),
    }
    assert lay["metadata"] < lay["arch_value"] < cuts["mid-token-list"][0] < lay["tensor_infos"]
    for label, (cut, phrase) in cuts.items():
        bad = truncated(path, tmp_path / f"cut-{label}.gguf", cut)
        _refused(bad, "truncated", phrase)


def test_tensor_count_of_2_pow_60(tiny, tmp_path):
    bad = patched(tiny[2], tmp_path / "tensors.gguf", 8, "<Q", 2**60)
    _refused(bad, f"claims {2**60} tensors", "cannot fit", "no file could hold that")


def test_metadata_count_of_2_pow_60(tiny, tmp_path):
    bad = patched(tiny[2], tmp_path / "kvs.gguf", 16, "<Q", 2**60)
    _refused(bad, f"claims {2**60} metadata key/value pairs", "cannot fit", "no file could hold that")


def test_metadata_string_length_of_2_pow_62(tiny, tmp_path):
    lay = gguf_layout(tiny[2])
    bad = patched(tiny[2], tmp_path / "string.gguf", lay["arch_value"], "<Q", 2**62)
    _refused(bad, str(2**62), "general.architecture", "exceeds the file size", "corrupt")


def test_metadata_array_length_beyond_the_file(tiny, tmp_path):
    """tokenizer.ggml.tokens claims 2**61 strings: refused before a single element is walked."""
    data = tiny[2].read_bytes()
    key = b"tokenizer.ggml.tokens"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4 + 4  # past key, type, element type
    bad = patched(tiny[2], tmp_path / "array.gguf", at, "<Q", 2**61)
    _refused(bad, str(2**61), "tokenizer.ggml.tokens", "exceeds the file size")


def test_tensor_dims_overflow(tiny, tmp_path):
    lay = gguf_layout(tiny[2])
    bad = patched(tiny[2], tmp_path / "dims.gguf", lay["first_tensor_dims"], "<Q", 2**62)
    _refused(bad, "token_embd.weight", "overflows")


def test_tensor_data_past_the_end_of_the_file(tiny, tmp_path):
    lay = gguf_layout(tiny[2])
    bad = patched(tiny[2], tmp_path / "offset.gguf", lay["first_tensor_offset"], "<Q", 2**40)
    _refused(bad, "token_embd.weight", "past the end of the file")


def test_tensor_dim_too_large_for_the_file(tiny, tmp_path):
    """A dim that does not overflow but makes the tensor bigger than the file."""
    lay = gguf_layout(tiny[2])
    bad = patched(tiny[2], tmp_path / "bigdim.gguf", lay["first_tensor_dims"], "<Q", 2**30)
    _refused(bad, "token_embd.weight", "past the end of the file")


def test_unknown_ggml_type(tiny, tmp_path):
    lay = gguf_layout(tiny[2])
    at = lay["first_tensor_offset"] - 4  # the u32 type sits just before the u64 offset
    bad = patched(tiny[2], tmp_path / "type.gguf", at, "<I", 12345)
    _refused(bad, "unknown ggml type 12345")


def test_unknown_metadata_value_type(tiny, tmp_path):
    lay = gguf_layout(tiny[2])
    at = lay["arch_value"] - 4  # the u32 value type of general.architecture
    bad = patched(tiny[2], tmp_path / "vtype.gguf", at, "<I", 77)
    _refused(bad, "unknown value type 77", "general.architecture")
