"""Test helpers for GGUF sources: a tiny random Llama written the way llama.cpp writes one, and
byte-level tools to make hostile GGUF files out of a good one.

Everything is built offline and in well under a second: the tokenizer is a byte-level BPE trained on
the license texts every Debian system ships, the model is a 2-layer Llama with random weights.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

LICENSES = Path("/usr/share/common-licenses")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The sentence the tests round-trip; the corpus fallback below contains its words, so it tokenizes the
# same way whether or not the license texts are there.
SENTENCE = "The licenses for most software are designed to take away your freedom to share and change it."

_FALLBACK_CORPUS = [
    SENTENCE,
    (
        "By contrast, the GNU General Public License is intended to guarantee your freedom to share and change "
        "all versions of a program, to make sure it remains free software for all its users."
    ),
    "When we speak of free software, we are referring to freedom, not price.",
] * 20


def _corpus() -> list[str]:
    """Lines of text to train the tokenizer on: the license texts, or a built-in paragraph if absent."""
    lines: list[str] = []
    for name in ("GPL-3", "Apache-2.0", "MPL-2.0"):
        f = LICENSES / name
        if f.is_file():
            lines += [line for line in f.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines or _FALLBACK_CORPUS


def train_tokenizer(vocab_size: int = 320) -> Any:
    """A small byte-level BPE (``tokenizers.Tokenizer``): specials first, then the 256 bytes, then merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def tokenizer_tables(tok: Any) -> tuple[list[str], list[str]]:
    """``(tokens in id order, merges as "a b" strings)`` — what a GGUF stores for a gpt2-style BPE."""
    vocab = tok.get_vocab()
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return tokens, merges


def build_tiny_llama(vocab_size: int, seed: int = 0, tie_word_embeddings: bool = False) -> Any:
    """A random 2-layer ``LlamaForCausalLM``, weights large enough that attention is sharp.

    With the default 0.02 init the attention is nearly uniform, and a q/k rotary permutation that was
    not undone would change the logits by less than a test tolerance; unit-scale weights make it show.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 * 1.5)
    return model


def _permute(w: Any, n_head: int, n_head_kv: int | None = None) -> Any:
    """llama.cpp's q/k permutation (convert_hf_to_gguf.py LlamaModel.permute): HF's half-split rotary
    layout -> ggml's interleaved pairs. transformers' LlamaTensorProcessor undoes exactly this."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(
    model: Any,
    tok: Any,
    path: Path,
    *,
    arch: str = "llama",
    extra_tokens: int = 0,
    permute_qk: bool = True,
    chat_template: str | None = CHAT_TEMPLATE,
    name: str = "tiny-llama",
    quantize: str | None = None,
) -> Path:
    """Write ``model`` + ``tok`` as an F32 GGUF with llama.cpp's tensor names and metadata keys.

    ``extra_tokens`` appends that many tokens to the vocabulary (not to the model): a file whose
    tokenizer does not fit its model. ``permute_qk=False`` writes q/k the HF way (a broken file, for a
    negative control). ``arch`` only renames ``general.architecture`` and the key prefix. ``quantize``
    (a ggml type name such as "Q8_0") stores the 2-D weights quantized, norms staying F32, as llama.cpp does.
    """
    import gguf
    import numpy as np

    cfg = model.config
    tokens, merges = tokenizer_tables(tok)
    tokens = tokens + [f"<extra_{i}>" for i in range(extra_tokens)]
    special_ids = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    token_types = [3 if i in special_ids else 1 for i in range(len(tokens))]  # 3 CONTROL, 1 NORMAL
    head_dim = cfg.hidden_size // cfg.num_attention_heads

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    qtype = gguf.GGMLQuantizationType[quantize] if quantize else None
    w.add_file_type({"Q8_0": 7, "Q4_0": 2, "F16": 1}.get(quantize or "", 0))  # llama_ftype; 0 is ALL_F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(len(tokens))])
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.token_to_id("<|endoftext|>"))
    w.add_eos_token_id(tok.token_to_id("<|endoftext|>"))
    if chat_template is not None:
        w.add_chat_template(chat_template)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf_name, gguf_name in names.items():
        if hf_name not in sd or (hf_name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue  # llama.cpp writes no output.weight for a tied model
        arr = sd[hf_name]
        if permute_qk and gguf_name.endswith("attn_q.weight"):
            arr = _permute(arr, cfg.num_attention_heads, cfg.num_attention_heads)
        elif permute_qk and gguf_name.endswith("attn_k.weight"):
            arr = _permute(arr, cfg.num_attention_heads, cfg.num_key_value_heads)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype is not None and arr.ndim == 2:
            w.add_tensor(gguf_name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, arr)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def quantization_roundtrip(model: Any, quantize: str) -> Any:
    """A copy of ``model`` whose 2-D weights went through ``quantize`` and back (gguf's reference
    numpy kernels): what a GGUF written with ``quantize=`` holds, as floats."""
    import copy

    import gguf
    import torch

    qtype = gguf.GGMLQuantizationType[quantize]
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            if p.ndim == 2:
                w = p.detach().float().numpy()
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)))
    return out


def tiny_llama_gguf(dest: Path) -> Path:
    """A valid tiny Llama GGUF at ``dest`` (a file path, or a folder to put ``tiny-llama.gguf`` in)."""
    dest = Path(dest)
    if dest.is_dir() or not dest.suffix:
        dest.mkdir(parents=True, exist_ok=True)
        dest = dest / "tiny-llama.gguf"
    tok = train_tokenizer()
    model = build_tiny_llama(tok.get_vocab_size())
    return write_llama_gguf(model, tok, dest)


# --- hostile files ------------------------------------------------------------------------------
def gguf_layout(path: Path) -> dict[str, int]:
    """Byte offsets inside a *valid* GGUF, to cut or patch at: where the metadata starts, where the
    first value of ``general.architecture`` is, where the tensor infos start, where the data starts."""
    data = Path(path).read_bytes()
    _, _, kv_count = struct.unpack_from("<IQQ", data, 4)
    pos = 24
    layout: dict[str, int] = {"metadata": 24}
    for _ in range(kv_count):
        (klen,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8 : pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if key == "general.architecture":
            layout["arch_value"] = pos  # u64 length, then the bytes
        pos = _skip_value(data, pos, vtype)
    layout["tensor_infos"] = pos
    (nlen,) = struct.unpack_from("<Q", data, pos)
    layout["first_tensor_dims"] = pos + 8 + nlen + 4  # after name and n_dims
    (n_dims,) = struct.unpack_from("<I", data, pos + 8 + nlen)
    layout["first_tensor_offset"] = layout["first_tensor_dims"] + 8 * n_dims + 4
    return layout


def _skip_value(data: bytes, pos: int, vtype: int) -> int:
    widths = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}
    if vtype in widths:
        return pos + widths[vtype]
    if vtype == 8:
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n
    etype, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    for _ in range(count):
        pos = _skip_value(data, pos, etype)
    return pos


def patched(src: Path, dest: Path, offset: int, fmt: str, value: int) -> Path:
    """A copy of ``src`` with ``struct.pack(fmt, value)`` written at ``offset``."""
    data = bytearray(Path(src).read_bytes())
    struct.pack_into(fmt, data, offset, value)
    Path(dest).write_bytes(bytes(data))
    return Path(dest)


def truncated(src: Path, dest: Path, size: int) -> Path:
    """The first ``size`` bytes of ``src``."""
    Path(dest).write_bytes(Path(src).read_bytes()[:size])
    return Path(dest)
