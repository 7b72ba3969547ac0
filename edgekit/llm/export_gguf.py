"""A transformers folder as GGUF files for llama.cpp: a float file (f16 or f32) from llama.cpp's own
converter, then ``llama-quantize`` to Q8_0, Q4_0 and Q4_K_M (optionally weighted by an importance matrix that
``llama-imatrix`` computes from a calibration text), each file with a per-tensor account read back from it.

Why llama.cpp's converter and quantizer rather than writing GGUF here: they are the reference for what the
runtime expects (tensor names, the tokenizer's pre-tokenizer name, the quantization mixes, the rules that keep a
tensor at more bits), and the vendored copies come from the same revision as the library that runs the files
(``llama_cpp.py``). The converter runs with the venv's Python and the vendored ``gguf-py`` first on its path.

The account: llama-quantize does not quantize every tensor to the type asked for. 1-D tensors (norms, biases)
stay float; a k-quant (blocks of 256) falls back to a 32-block type when a row is not a multiple of 256
(Q4_K -> Q5_0, Q6_K -> Q8_0) and to F16 when not even 32 fits; the token embedding and the output layer follow
their own rules (output: Q6_K in most mixes, Q8_0 when its row does not fit the block); Q4_K_M gives some
layers' attn_v and ffn_down Q6_K. So every tensor of every file is listed with the type the file's type asks
for, the type it has (read with gguf-py's ``GGUFReader``) and, where they differ, why. Nothing falls back
silently: the summary names every tensor not at the requested type, grouped by reason.

A tokenizer whose BPE pre-tokenizer the converter does not recognise (it checks a hash of a test string's
tokens against the models it knows) is matched by its structure in ``tokenizer.json`` instead (GPT-2's
byte-level regex, Qwen2's split regex, Llama 3's), and the file's notes say so; one that matches none is
refused with the converter's message."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.host import current
from ..artifact import LineageStep
from ..errors import BadInputError, ConversionError
from ..fsutil import atomic_path, sha256_file
from .llama_cpp import LlamaCppTools, tools
from .source import check_folder

HOP = "transformers->gguf (llama.cpp)"
FLOAT_TYPES = {"f16": "F16", "f32": "F32", "bf16": "BF16"}
# the llama-quantize file type -> the tensor type it asks for (the mix's base type)
QUANT_TYPES = {
    "Q8_0": "Q8_0",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
    "Q3_K_M": "Q3_K",
    "Q2_K": "Q2_K",
}
DEFAULT_QUANTS = ("Q8_0", "Q4_0", "Q4_K_M")
EMBED_OUTPUT = ("token_embd.weight", "output.weight")
_FALLBACK_RE = re.compile(
    r"warning:\s+(\S+)\s+-\s+ncols\s+(\d+)\s+not divisible by\s+(\d+)\s+\(required for type\s+"
    r"(\S+)\)\s*(?:\(WARNING: must use F16 due to unusual shape\)\s*)?-> falling back to\s+(\S+)"
)

# Run in the venv's Python: the converter with one change, a pre-tokenizer it does not know by hash is matched
# by tokenizer.json's structure (printed as EDGEKIT_TOKENIZER_PRE so the host records it). No import of edgekit.
_CONVERT = r"""
import json, runpy, sys
root, convert = sys.argv[1], sys.argv[2]
sys.path[:0] = [root + "/gguf-py", root]
import conversion.base as base

def infer(folder):
    try:
        with open(folder / "tokenizer.json", encoding="utf-8") as fh:
            pre = json.load(fh).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return None
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        pattern = (parts[0].get("pattern") or {}).get("Regex", "")
        if "\\p{N}| ?[^\\s\\p{L}\\p{N}]+" in pattern and "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+" in pattern:
            return "qwen2"
        if "\\p{N}{1,3}" in pattern and "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+" in pattern:
            return "llama-bpe"
    return None

known = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        pre = infer(self.dir_model)
        if pre is None:
            raise
        print("EDGEKIT_TOKENIZER_PRE " + pre, file=sys.stderr, flush=True)
        return pre
base.TextModel.get_vocab_base_pre = get_vocab_base_pre

# GPT-2's converter reads hparams["n_ctx"], which transformers' GPT2Config no longer writes (a GPT-2 saved by a
# current transformers has only n_positions, the same number): give it that, and say so
load_hparams = base.ModelBase.load_hparams
def load_hparams_n_ctx(*args, **kwargs):
    hp = load_hparams(*args, **kwargs)
    if hp.get("model_type") == "gpt2" and "n_ctx" not in hp and "n_positions" in hp:
        hp["n_ctx"] = hp["n_positions"]
        print("EDGEKIT_N_CTX " + str(hp["n_ctx"]), file=sys.stderr, flush=True)
    return hp
base.ModelBase.load_hparams = staticmethod(load_hparams_n_ctx)
sys.argv = [convert] + sys.argv[3:]
runpy.run_path(convert, run_name="__main__")
"""


@dataclass
class GGUFFile:
    """One written GGUF file and what is in it."""

    path: Path
    file_type: str  # "F16", "Q8_0", "Q4_K_M"...
    requested: str  # the tensor type the file type asks for ("Q4_K" for Q4_K_M)
    sha256: str
    seconds: float
    account: list[dict[str, Any]]  # one dict a tensor: name, shape, row_width, requested, actual, kind, reason
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    imatrix: str | None = None  # the importance matrix file the quantization used

    def step(self) -> LineageStep:
        """The lineage step that made this file (the account's summary as its metrics)."""
        name = HOP if self.file_type in FLOAT_TYPES.values() else f"quantize (llama.cpp {self.file_type})"
        return LineageStep(
            kind="convert" if name == HOP else "pass",
            name=name,
            seconds=self.seconds,
            config={"file_type": self.file_type, "imatrix": self.imatrix},
            metrics={"quantization": self.summary, "notes": self.notes},
        )


def _fail_tail(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n  ".join(lines[-n:])


def convert_to_gguf(
    folder: str | Path, dest: str | Path, *, outtype: str = "f16", llama: LlamaCppTools | None = None
) -> GGUFFile:
    """The float GGUF of a transformers folder, written atomically at ``dest``."""
    folder, dest = Path(folder), Path(dest)
    if outtype not in FLOAT_TYPES:
        raise BadInputError(f"GGUF base type {outtype!r} is not one of {sorted(FLOAT_TYPES)}")
    data = check_folder(folder)
    arch = str((data.get("architectures") or ["?"])[0])
    t = llama or tools()
    t0 = time.perf_counter()
    with atomic_path(dest) as tmp:
        cmd = [
            sys.executable,
            "-c",
            _CONVERT,
            str(t.root),
            str(t.convert),
            str(folder),
            "--outfile",
            str(tmp),
            "--outtype",
            outtype,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, env=t.converter_env())
        out = res.stdout + res.stderr
        if res.returncode != 0 or tmp.stat().st_size == 0:
            if "not supported" in out or "NotImplementedError: Architecture" in out:
                raise ConversionError(
                    f"{folder}: llama.cpp's converter (llama-cpp-python {t.version}) does not "
                    f"support the architecture {arch}:\n  {_fail_tail(out, 4)}",
                    hop=HOP,
                    hint="use an architecture llama.cpp converts (Llama, Qwen2/3, Gemma, Phi, "
                    "Mistral...), or a newer llama.cpp",
                )
            if "pre-tokenizer was not recognized" in out:
                raise ConversionError(
                    f"{folder} ({arch}): llama.cpp's converter does not know this tokenizer's "
                    "BPE pre-tokenizer, and its tokenizer.json matches none edgekit recognises "
                    "(GPT-2 byte-level, Qwen2, Llama 3)",
                    hop=HOP,
                    hint="ship the model's original tokenizer files, or add its pre-tokenizer "
                    "to llama.cpp's convert_hf_to_gguf_update.py",
                )
            raise ConversionError(
                f"{folder} ({arch}): convert_hf_to_gguf.py failed (exit {res.returncode}):\n  {_fail_tail(out)}",
                hop=HOP,
                hint="the converter's message above names the tensor or setting it refused",
            )
    seconds = round(time.perf_counter() - t0, 3)
    notes = []
    m = re.search(r"EDGEKIT_TOKENIZER_PRE (\S+)", res.stderr)
    if m:
        notes.append(
            f"tokenizer pre-tokenizer {m.group(1)!r} matched from tokenizer.json's structure (the "
            "converter's hash list does not know this tokenizer)"
        )
    if "EDGEKIT_N_CTX" in res.stderr:
        notes.append(
            "context length from config.json's n_positions (GPT-2's converter reads n_ctx, which current "
            "transformers no longer writes)"
        )
    requested = FLOAT_TYPES[outtype]
    account = tensor_account(dest, requested, file_type=requested)
    return GGUFFile(dest, requested, requested, sha256_file(dest), seconds, account, summarize(account), notes)


def compute_imatrix(
    base: str | Path,
    text: str | Path,
    dest: str | Path,
    *,
    context: int = 256,
    chunks: int = 64,
    threads: int | None = None,
    llama: LlamaCppTools | None = None,
) -> Path:
    """An importance matrix (llama-imatrix over ``text``, ``chunks`` windows of ``context`` tokens) at ``dest``."""
    t = llama or tools()
    text, dest = Path(text), Path(dest)
    if not text.is_file():
        raise BadInputError(f"calibration text {text} does not exist")
    with atomic_path(dest) as tmp:
        cmd = [
            str(t.imatrix),
            "-m",
            str(base),
            "-f",
            str(text),
            "-o",
            str(tmp),
            "-c",
            str(context),
            "--chunks",
            str(chunks),
            "-t",
            str(threads or _threads()),
            "--no-ppl",
            "--output-format",
            "gguf",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or tmp.stat().st_size == 0:
            raise ConversionError(
                f"llama-imatrix failed on {text} (exit {res.returncode}):\n  {_fail_tail(res.stdout + res.stderr)}",
                hop="llama.cpp imatrix",
                hint=f"the text needs at least 2 windows of {context} tokens; give a longer text or a smaller context",
            )
    return dest


def quantize_gguf(
    base: str | Path,
    dest: str | Path,
    file_type: str,
    *,
    imatrix: str | Path | None = None,
    threads: int | None = None,
    llama: LlamaCppTools | None = None,
) -> GGUFFile:
    """``base`` (a float GGUF) quantized by llama-quantize to ``file_type`` at ``dest``, with its account."""
    if file_type not in QUANT_TYPES:
        raise BadInputError(f"llama.cpp file type {file_type!r} is not one of {sorted(QUANT_TYPES)}")
    t = llama or tools()
    dest = Path(dest)
    t0 = time.perf_counter()
    with atomic_path(dest) as tmp:
        cmd = [
            str(t.quantize),
            *(["--imatrix", str(imatrix)] if imatrix else []),
            str(base),
            str(tmp),
            file_type,
            str(threads or _threads()),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise ConversionError(
                f"llama-quantize {file_type} of {base} failed (exit {res.returncode}):\n  "
                f"{_fail_tail(res.stdout + res.stderr)}",
                hop=f"llama.cpp {file_type}",
            )
    seconds = round(time.perf_counter() - t0, 3)
    fallbacks = {
        m.group(1): {
            "ncols": int(m.group(2)),
            "block": int(m.group(3)),
            "wanted": m.group(4).upper(),
            "got": m.group(5).upper(),
        }
        for m in _FALLBACK_RE.finditer(res.stdout + res.stderr)
    }
    requested = QUANT_TYPES[file_type]
    account = tensor_account(dest, requested, file_type=file_type, fallbacks=fallbacks)
    return GGUFFile(
        dest,
        file_type,
        requested,
        sha256_file(dest),
        seconds,
        account,
        summarize(account),
        imatrix=str(imatrix) if imatrix else None,
    )


def export_gguf(
    folder: str | Path,
    out_dir: str | Path,
    *,
    name: str = "model",
    base: str = "f16",
    quants: tuple[str, ...] = DEFAULT_QUANTS,
    imatrix_text: str | Path | None = None,
    imatrix_context: int = 256,
    threads: int | None = None,
) -> dict[str, GGUFFile]:
    """``{file type: GGUFFile}``: ``out_dir/<name>-<type>.gguf`` for the float base and each of ``quants``.
    ``imatrix_text`` (off by default): quantize with an importance matrix computed from that text."""
    t = tools()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    first = convert_to_gguf(folder, out / f"{name}-{base}.gguf", outtype=base, llama=t)
    files = {first.file_type: first}
    im = None
    if imatrix_text is not None:
        im = compute_imatrix(
            first.path, imatrix_text, out / f"{name}-imatrix.gguf", context=imatrix_context, threads=threads, llama=t
        )
    for q in quants:
        files[q] = quantize_gguf(first.path, out / f"{name}-{q.lower()}.gguf", q, imatrix=im, threads=threads, llama=t)
    return files


def _threads() -> int:
    ht = current()
    return ht.threads if ht is not None else 1


# ---------------------------------------------------------------------------------------------- the account
def _type_name(t: Any) -> str:
    return str(getattr(t, "name", t)).upper()


def _reason(
    name: str,
    ncols: int,
    ndim: int,
    requested: str,
    actual: str,
    file_type: str,
    fallbacks: dict[str, dict[str, Any]],
    block_of: Any,
) -> tuple[str, str | None]:
    """(kind, why) for one tensor: kind "requested" (why None), "float_1d", "block", "rule" or "mix"."""
    if actual == requested:
        return "requested", None
    if ndim < 2:
        return "float_1d", (
            f"1-D tensor (a norm or bias): llama-quantize quantizes only 2-D/3-D weights, it stays {actual}"
        )
    fb = fallbacks.get(name)
    if fb is not None:
        wanted = fb["wanted"]
        mix = "" if wanted == requested else f"the {file_type} rules want {wanted} for it; "
        return "block", (
            f"{mix}its row width {fb['ncols']} is not a multiple of {wanted}'s block size "
            f"{fb['block']}: llama-quantize fell back to {actual}"
        )
    req_block = block_of(requested)
    if name in EMBED_OUTPUT:
        what = "token embedding" if name.startswith("token_embd") else "output layer"
        if name == "output.weight" and ncols % req_block:
            return "rule", (
                f"llama-quantize's rule for the output layer: Q8_0 when its row width {ncols} is not a "
                f"multiple of {requested}'s block size {req_block}"
            )
        return "rule", f"llama-quantize's rule for the {what} in a {file_type} file puts it at {actual}"
    if ncols % req_block:  # (F16 and F32 are blocks of 1)
        return "block", (
            f"its row width {ncols} is not a multiple of {requested}'s block size {req_block}: "
            f"llama-quantize fell back to {actual}"
        )
    if requested in ("F16", "F32", "BF16"):
        return "rule", f"the converter keeps this tensor at {actual}"
    return "mix", (
        f"the {file_type} mix puts this tensor at {actual} (llama-quantize gives some layers' attn_v and "
        f"ffn_down more bits)"
    )


def tensor_account(
    path: str | Path,
    requested: str,
    *,
    file_type: str | None = None,
    fallbacks: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every tensor in the GGUF at ``path``: name, shape (PyTorch order: rows first), row width, the requested
    and the actual type, and where they differ the kind and the reason. ``fallbacks``: llama-quantize's own
    fallback lines ({tensor: {ncols, block, wanted, got}}), which name the type its rules wanted."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def block_of(type_name: str) -> int:
        return int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0])

    out = []
    for t in reader.tensors:
        ne = [int(d) for d in t.shape]  # GGML order: ne[0] is the row width
        actual = _type_name(t.tensor_type)
        kind, why = _reason(
            t.name, ne[0], len(ne), requested, actual, file_type or requested, fallbacks or {}, block_of
        )
        out.append(
            {
                "name": t.name,
                "shape": list(reversed(ne)),
                "row_width": ne[0],
                "requested": requested,
                "actual": actual,
                "kind": kind,
                "reason": why,
            }
        )
    return out


def summarize(account: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per type, and the names of the tensors not at the requested type by kind."""
    types: dict[str, int] = {}
    by_kind: dict[str, list[str]] = {}
    for a in account:
        types[a["actual"]] = types.get(a["actual"], 0) + 1
        if a["kind"] != "requested":
            by_kind.setdefault(a["kind"], []).append(a["name"])
    requested = account[0]["requested"] if account else None
    return {
        "requested": requested,
        "tensors": len(account),
        "types": dict(sorted(types.items())),
        "at_requested": types.get(requested, 0) if requested else 0,
        "not_requested": by_kind,
        "fell_back": sorted(by_kind.get("block", []) + by_kind.get("rule", [])),
    }


__all__ = [
    "GGUFFile",
    "export_gguf",
    "convert_to_gguf",
    "quantize_gguf",
    "compute_imatrix",
    "tensor_account",
    "summarize",
    "DEFAULT_QUANTS",
    "QUANT_TYPES",
]
