"""A zoo of tiny, *trained* causal language models saved as ordinary transformers model folders.

Tests of the LLM paths (export, decoding runners, quantization, perplexity measurement, chat
templates) need a decoder that is small enough to build in seconds on one CPU thread, yet real:
a standard architecture that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load from a folder with
``local_files_only=True``, and weights that have actually learned something, so that perplexity
differences between a float model and its conversion mean something (a random-init model has a flat,
near-uniform output distribution that hides most numerical faults).

What a folder from :func:`build_tiny_lm` holds:

* ``config.json`` and ``model.safetensors`` (float32) for ``LlamaForCausalLM`` (untied lm_head) or
  ``Qwen2ForCausalLM`` (tied lm_head, q/k/v biases), grouped-query attention by default;
* ``generation_config.json`` (greedy; bos/eos/pad ids);
* ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE tokenizer trained offline on the
  licence texts in ``/usr/share/common-licenses`` (GPT-2 style pre-tokenizer for llama, Qwen2's
  NFC + split-regex pipeline for qwen2), with special tokens ``<pad>`` (0), ``<s>`` (1),
  ``</s>`` (2), ``<unk>`` (3) and a small Jinja chat template kept inside ``tokenizer_config.json``.
  Encoding adds no BOS/EOS by itself (the model was trained on plain token streams); the chat
  template writes ``bos_token`` explicitly;
* ``edgekit_zoo.json``: how it was built and what it learned (final training loss, held-out loss,
  ``log(vocab)`` for comparison, build seconds).

The corpus is every regular file (symlinks skipped) in ``/usr/share/common-licenses``, read as
UTF-8 with ``errors="replace"`` in sorted name order and joined with blank lines. The last ~10% of
that concatenation (cut at a line boundary) is held out: neither the tokenizer nor the model sees
it, and :func:`eval_text` writes it out for perplexity tests. Note that licences overlap in
wording (GPL-2/GPL-3, MPL-1.1/MPL-2.0), so "held-out" means unseen text, not unseen style.

:func:`planted_outlier_lm` derives a model whose float function is unchanged but one layer's
``mlp.down_proj`` has a few huge input columns, so low-bit weight quantization of that one layer
hurts much more than of any other.

Building costs seconds; with ``dest=None`` results are cached under
``$XDG_CACHE_HOME/edgekit-test/lm/<key>/`` (``~/.cache`` when unset), keyed by this file's source,
the arguments and the corpus, so editing this file invalidates the cache.

Run ``python tests/lm_zoo.py`` to build both families and print their losses.

Nothing here runs at import; torch / transformers / tokenizers are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

CORPUS_DIR = Path("/usr/share/common-licenses")
HELDOUT_FRACTION = 0.10
FAMILIES = ("llama", "qwen2")
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
ZOO_JSON = "edgekit_zoo.json"
WINDOW = 64
BATCH = 16
LR = 3e-3

# transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX, used if that module cannot be imported
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# --------------------------------------------------------------------------------------- corpus


def _corpus() -> tuple[str, str]:
    """(training text, held-out text): the licence corpus, its last ~10% (cut at a newline) held out."""
    if not CORPUS_DIR.is_dir():
        raise FileNotFoundError(f"{CORPUS_DIR} is missing: the tiny-LM zoo trains on its licence texts")
    parts = []
    for p in sorted(CORPUS_DIR.iterdir()):
        if p.is_symlink() or not p.is_file():
            continue
        parts.append(p.read_bytes().decode("utf-8", errors="replace").strip())
    text = "\n\n".join(parts) + "\n"
    cut = int(len(text) * (1.0 - HELDOUT_FRACTION))
    nl = text.find("\n", cut)
    cut = nl + 1 if nl != -1 else cut
    return text[:cut], text[cut:]


def eval_text(dest: Path) -> Path:
    """Write the held-out text (the last ~10% of the concatenated licence corpus, cut at a line
    boundary; the tokenizer and every zoo model were trained only on the text before it) and return
    its path. ``dest`` is a directory (the file is ``dest/heldout.txt``) or a file path (a path that
    does not exist yet and has a suffix, e.g. ``tmp_path / "eval.txt"``). About 24 KB of English
    prose (~13k tokens with the default 384-token vocabulary)."""
    dest = Path(dest)
    if dest.is_dir() or (not dest.exists() and not dest.suffix):
        dest.mkdir(parents=True, exist_ok=True)
        dest = dest / "heldout.txt"
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(_corpus()[1], encoding="utf-8")
    return dest


# ------------------------------------------------------------------------------------ tokenizer


def _qwen2_pretokenize_regex() -> str:
    try:  # the very regex transformers' Qwen2Tokenizer rebuilds its pipeline with
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        return PRETOKENIZE_REGEX
    except ImportError:
        return QWEN2_PRETOKENIZE_REGEX


def _train_tokenizer(text: str, vocab: int, context: int, family: str) -> Any:
    """A byte-level BPE with exactly ``vocab`` entries (4 specials + 256 bytes + merges), wrapped as
    a ``PreTrainedTokenizerFast``.

    llama: GPT-2 style ``ByteLevel`` pre-tokenizer, no normalizer. qwen2: Qwen2's own pipeline (NFC
    normalizer, Qwen2's split regex, then ``ByteLevel(use_regex=False)``), because transformers 5's
    ``AutoTokenizer`` maps model_type ``qwen2`` to ``Qwen2Tokenizer``, which rebuilds that pipeline
    from the vocabulary and merges and ignores the one in ``tokenizer.json``: matching it keeps the
    ids identical whichever way the folder is loaded."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS.values())
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab < len(specials) + len(alphabet) + 1:
        raise ValueError(f"vocab={vocab} is too small for a byte-level BPE (need > {len(specials) + len(alphabet)})")
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    if family == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_qwen2_pretokenize_regex()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=context, clean_up_tokenization_spaces=False, **SPECIAL_TOKENS
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# ---------------------------------------------------------------------------------------- model


def _make_model(family: str, vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int,
                context: int, ids: dict[str, int]) -> Any:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
    }
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common))
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def _heldout_loss(model: Any, ids: Any, window: int) -> float:
    """Mean next-token cross-entropy over consecutive non-overlapping windows of the held-out ids."""
    import torch

    n = (len(ids) - 1) // window
    xs = ids[: n * window].view(n, window)
    ys = ids[1 : n * window + 1].view(n, window)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, 32):
            logits = model(input_ids=xs[i : i + 32]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ys[i : i + 32].reshape(-1), reduction="sum"
            )
            total += loss.item()
            count += ys[i : i + 32].numel()
    return total / count


def _build(family: str, dest: Path, *, hidden: int, layers: int, heads: int, kv_heads: int, context: int,
           vocab: int, steps: int, seed: int) -> None:
    import torch
    from transformers import GenerationConfig

    t0 = time.perf_counter()
    train_text, heldout_text = _corpus()
    tokenizer = _train_tokenizer(train_text, vocab, context, family)
    ids = {k: tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[f"{k}_token"]) for k in ("pad", "bos", "eos", "unk")}
    # the backend tokenizer: no "longer than model_max_length" warning for the whole corpus
    train_ids = torch.tensor(tokenizer.backend_tokenizer.encode(train_text).ids, dtype=torch.long)
    held_ids = torch.tensor(tokenizer.backend_tokenizer.encode(heldout_text).ids, dtype=torch.long)
    window = min(WINDOW, context)

    torch.manual_seed(seed)
    model = _make_model(family, len(tokenizer), hidden, layers, heads, kv_heads, context, ids)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, min(20, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warmup if s < warmup
        else 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))),
    )
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(window + 1)
    losses: list[float] = []
    for _ in range(steps):
        starts = torch.randint(0, len(train_ids) - window - 1, (BATCH,), generator=gen)
        chunk = train_ids[starts[:, None] + offsets]
        logits = model(input_ids=chunk[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    heldout = _heldout_loss(model, held_ids, window)

    model.generation_config = GenerationConfig(
        do_sample=False, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    # save_jinja_files=False: transformers 5 otherwise writes the template to chat_template.jinja
    tokenizer.save_pretrained(dest, save_jinja_files=False)
    tail = losses[-10:] if losses else [float("nan")]
    info = {
        "family": family,
        "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads, "context": context,
        "vocab": len(tokenizer), "steps": steps, "seed": seed, "batch": BATCH, "window": window, "lr": LR,
        "train_loss": sum(tail) / len(tail),
        "train_loss_last_step": losses[-1] if losses else None,
        "first_loss": losses[0] if losses else None,
        "heldout_loss": heldout,
        "uniform_loss": math.log(len(tokenizer)),
        "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
        "heldout": "last ~10% of the concatenated /usr/share/common-licenses texts (see eval_text)",
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    (dest / ZOO_JSON).write_text(json.dumps(info, indent=2) + "\n")


# ----------------------------------------------------------------------------------- public API


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgekit-test" / "lm"


def _cache_key(args: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps(args, sort_keys=True).encode())
    train_text, heldout_text = _corpus()
    h.update(hashlib.sha256((train_text + heldout_text).encode()).digest())
    return h.hexdigest()[:32]


def build_tiny_lm(
    family: str,
    dest: Path | None = None,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    context: int = 256,
    vocab: int = 384,
    steps: int = 300,
    seed: int = 0,
) -> Path:
    """Train a tiny ``family`` ("llama" or "qwen2") causal LM and return its model folder.

    With ``dest=None`` the folder is cached under ``$XDG_CACHE_HOME/edgekit-test/lm/<key>/`` and
    reused while its ``edgekit_zoo.json`` exists (it is built under a temporary name and renamed
    into place, so a half-built folder is never reused); treat a cached folder as read-only (copy it
    before changing it). With ``dest`` given, the model is built there, uncached. Deterministic
    given the arguments (one CPU thread, seeded init and batch sampling)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"hidden={hidden}, heads={heads}, kv_heads={kv_heads}: need hidden % heads == heads % kv_heads == 0"
        )
    import torch

    args = {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads, "context": context,
            "vocab": vocab, "steps": steps, "seed": seed}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if dest is not None:
            dest = Path(dest)
            _build(family, dest, **args)
            return dest
        final = _cache_root() / f"{family}-{_cache_key({'family': family, **args})}"
        if (final / ZOO_JSON).is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        try:
            _build(family, tmp, **args)
            if final.exists() and not (final / ZOO_JSON).is_file():
                shutil.rmtree(final, ignore_errors=True)  # left half-made by something else
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / ZOO_JSON).is_file():  # not a concurrent builder winning the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final
    finally:
        torch.set_num_threads(threads)


def planted_outlier_lm(src: Path, dest: Path, layer: int = 0, scale: float = 50.0) -> Path:
    """Copy the model folder ``src`` to ``dest`` and plant weight outliers in one layer.

    In layer ``layer``, the MLP computes ``down_proj(silu(gate_proj(x)) * up_proj(x))``; the product
    is linear in ``up_proj``'s output, so for a few intermediate channels ``j`` (4 of them, evenly
    spaced) we multiply column ``j`` of ``mlp.down_proj.weight`` by ``scale`` and divide row ``j``
    of ``mlp.up_proj.weight`` by ``scale``. The float function is unchanged up to float32 rounding
    (bit-identical when ``scale`` is a power of two), but ``down_proj``'s weight now has columns
    ``scale`` times larger than the rest: with per-output-channel (row-wise) or per-tensor low-bit
    quantization those columns set every row's scale, and the ordinary weights of that layer round
    to a few levels (mostly zero), so quantizing that one layer hurts far more than any other.
    (Quantizing ``up_proj`` per-tensor would in turn flush its shrunken rows; per-row it is fine.)

    The planted tensors and channels are recorded under ``"planted_outlier"`` in
    ``edgekit_zoo.json``; its losses still describe the float model, which is unchanged."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dest = Path(src), Path(dest)
    if dest.resolve() == src.resolve():
        raise ValueError("planted_outlier_lm needs a dest other than src (a cached src must stay intact)")
    shutil.copytree(src, dest, dirs_exist_ok=True)
    weights_file = dest / "model.safetensors"
    sd = load_file(str(weights_file))
    down = f"model.layers.{layer}.mlp.down_proj.weight"
    up = f"model.layers.{layer}.mlp.up_proj.weight"
    if down not in sd or up not in sd:
        raise ValueError(f"{src} has no layer {layer} MLP ({down!r})")
    inter = sd[down].shape[1]
    channels = list(range(0, inter, max(1, inter // 4)))[:4]
    idx = torch.tensor(channels)
    with torch.no_grad():
        sd[down][:, idx] *= scale
        sd[up][idx, :] /= scale
    save_file({k: v.contiguous() for k, v in sd.items()}, str(weights_file), metadata={"format": "pt"})
    zoo = dest / ZOO_JSON
    info = json.loads(zoo.read_text()) if zoo.is_file() else {}
    info["planted_outlier"] = {"layer": layer, "scale": scale, "channels": channels,
                               "scaled_columns_of": down, "divided_rows_of": up}
    zoo.write_text(json.dumps(info, indent=2) + "\n")
    return dest


if __name__ == "__main__":
    for fam in FAMILIES:
        t = time.perf_counter()
        folder = build_tiny_lm(fam)
        zinfo = json.loads((folder / ZOO_JSON).read_text())
        print(f"{fam}: {folder} ({time.perf_counter() - t:.1f}s) train {zinfo['train_loss']:.3f} "
              f"held-out {zinfo['heldout_loss']:.3f} uniform {zinfo['uniform_loss']:.3f}")
