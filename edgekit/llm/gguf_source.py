"""A GGUF file (llama.cpp's format) as the source of a language model.

Two steps, kept apart on purpose:

* :func:`check_gguf` walks the file's header, metadata and tensor table itself, with every count,
  length and offset checked against the file's size before it is used. A GGUF is often downloaded from
  a stranger; ``gguf.GGUFReader`` memory-maps it and trusts its counts, so a corrupt or hostile file
  can make it allocate without bound, loop for hours or fail with an IndexError deep inside numpy.
  Nothing heavier than this walk ever sees a file that has not passed it.
* :func:`gguf_to_folder` then lets transformers dequantize the weights and rebuild the tokenizer, and
  writes a plain float transformers folder that the rest of edgekit (export, compress, measure) reads
  like any other model, plus ``edgekit_source.json`` saying which GGUF it came from.

torch, transformers and gguf are imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdgekitError, MissingExtraError, ModelLoadError, OutputError, require
from ..fsutil import sha256_file

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v1 counted in 32 bits and is gone from the wild; v2 and v3 share a layout
GGML_MAX_DIMS = 4  # llama.cpp's limit on a tensor's rank
DEFAULT_ALIGNMENT = 32  # llama.cpp's, when general.alignment is absent
SOURCE_FILE = "edgekit_source.json"
_INT64_MAX = 2**63 - 1
_PLAUSIBLE_FILE_BYTES = 2**48  # 256 TiB: a claim beyond this is corruption, not a short download

# metadata value types (gguf.GGUFValueType): struct format of the fixed-size ones
_SCALAR_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Smallest possible encodings, to refuse counts that could not fit in the file before looping on them:
# a key/value pair is a key length (8) + type (4) + a 1-byte value; a tensor info is a name length (8)
# + rank (4) + type (4) + offset (8).
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
# ggml types that hold plain values, not quantized blocks
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}
# transformers' legacy GGUF loader keys some architectures by its model_type; llama.cpp spells them so
_GGUF_SPELLING = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss", "minimax_m2": "minimax-m2"}
# the transformers model_type a GGUF architecture becomes, where the names differ (the text-only halves
# for the multimodal families: a GGUF carries the language model only)
_MODEL_TYPE = {
    **{gguf: hf for hf, gguf in _GGUF_SPELLING.items()},
    "gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text",
}  # fmt: skip

_HINT_REDOWNLOAD = "the file is damaged or not a GGUF model: download or convert it again"


@dataclass(frozen=True)
class GGUFInfo:
    """What a checked GGUF file is, without having loaded it: enough to decide and to record."""

    path: str
    version: int
    tensor_count: int
    kv_count: int
    architecture: str
    name: str | None
    quantization_types: dict[str, int]  # ggml type name -> how many tensors are stored in it
    context_length: int | None
    vocab_size: int | None  # length of tokenizer.ggml.tokens
    has_chat_template: bool
    file_size: int
    sha256: str

    @property
    def is_quantized(self) -> bool:
        """Whether any tensor is stored as quantized blocks rather than plain floats."""
        return any(t not in _FLOAT_TYPES for t in self.quantization_types)


@dataclass(frozen=True)
class _Array:
    """A metadata array, kept as its element type and length: the values are never held."""

    element_type: int
    count: int


@dataclass(frozen=True)
class _Tensor:
    name: str
    dims: tuple[int, ...]  # ggml order: fastest-moving first
    ggml_type: str
    offset: int  # from the start of the data section
    nbytes: int


@dataclass
class _Scan:
    info: GGUFInfo
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[_Tensor] = field(default_factory=list)


def check_gguf(path: Path) -> GGUFInfo:
    """Validate ``path`` as a GGUF file, cheaply and safely, and describe it.

    Raises :class:`ModelLoadError` naming the file and the exact problem for: a missing or empty
    file, wrong magic, an unsupported version, a file truncated anywhere, a tensor or metadata count
    that could not fit in the file, a string or array longer than the file, an unknown value or ggml
    type, a tensor whose dims overflow or whose data lies past the end of the file, overlapping or
    misaligned tensor data, duplicate keys or tensor names. Memory use is bounded by the file's size,
    never by a count the file claims.
    """
    return _scan(Path(path)).info


# --- the walk ---------------------------------------------------------------------------------
class _Cursor:
    """Bounded reads over the mapped file; every read says what it was reading, for the error."""

    def __init__(self, buf: Any, size: int, path: Path):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, problem: str, hint: str = _HINT_REDOWNLOAD) -> ModelLoadError:
        return ModelLoadError(f"GGUF file {self.path}: {problem}", hint=hint)

    def truncated(self, what: str, need: int) -> ModelLoadError:
        return self.fail(
            f"the file is truncated: {what} needs {need} bytes at offset {self.pos} but the file ends at "
            f"byte {self.size}",
            hint="the download or copy was cut short: fetch the file again and compare its size or sha256",
        )

    def take(self, n: int, what: str) -> int:
        """Claim ``n`` bytes at the cursor; return where they start."""
        if n > self.size - self.pos:
            raise self.truncated(what, n)
        start = self.pos
        self.pos += n
        return start

    def unpack(self, fmt: str, what: str) -> Any:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", what))

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", what))

    def length(self, n: int, unit: int, what: str) -> None:
        """Refuse ``n`` items of at least ``unit`` bytes each that cannot fit in what is left of the file,
        before anything loops on ``n`` or allocates for it."""
        if n * unit > self.size:
            raise self.fail(f"{what} is {n}, which exceeds the file size ({self.size} bytes): {_why(n * unit)}")
        if n * unit > self.size - self.pos:
            raise self.truncated(what, n * unit)

    def string(self, what: str, keep: bool = True, strict: bool = False) -> str | None:
        n = self.u64(f"the length of {what}")
        self.length(n, 1, f"the length of {what}")
        start = self.take(n, what)
        if not keep:
            return None
        raw = bytes(self.buf[start : start + n])
        if not strict:
            return raw.decode("utf-8", errors="replace")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc

    def value(self, value_type: int, what: str) -> Any:
        """Read one metadata value; arrays come back as :class:`_Array`, their elements skipped."""
        if value_type in _SCALAR_FORMAT:
            v = self.unpack(_SCALAR_FORMAT[value_type], what)
            return bool(v) if value_type == 7 else v
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY:
            element_type = self.u32(f"the element type of {what}")
            count = self.u64(f"the length of {what}")
            if element_type in _SCALAR_FORMAT:
                width = struct.calcsize(_SCALAR_FORMAT[element_type])
                self.length(count, width, f"the length of {what}")
                self.take(count * width, what)
            elif element_type == _STRING:
                self.length(count, 8, f"the length of {what}")
                for i in range(count):  # bounded: count * 8 fits in what is left of the file
                    self.string(f"element {i} of {what}", keep=False)
            elif element_type == _ARRAY:
                raise self.fail(f"{what} is an array of arrays, which GGUF readers (llama.cpp's too) refuse")
            else:
                raise self.fail(f"{what} is an array of unknown value type {element_type}")
            return _Array(element_type, count)
        raise self.fail(f"{what} has unknown value type {value_type} (known: 0-12)")


def _why(claimed_bytes: int, what: str = "count") -> str:
    """Why a claim does not fit: no real file is that big, so it is corrupt; else the file may be cut short."""
    if claimed_bytes > _PLAUSIBLE_FILE_BYTES:
        return f"no file could hold that, so the {what} is corrupt"
    return f"the file is truncated, or the {what} is corrupt"


def _scan(path: Path) -> _Scan:
    """Walk the whole structure of ``path``; see :func:`check_gguf`."""
    if not path.exists():
        raise ModelLoadError(f"GGUF file {path} does not exist", hint="check the path")
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} is not a file", hint="pass the .gguf file itself")
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"GGUF file {path} is empty", hint=_HINT_REDOWNLOAD)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        scan = _walk(_Cursor(buf, size, path))
    return scan


def _walk(cur: _Cursor) -> _Scan:
    path, size = cur.path, cur.size
    magic = bytes(cur.buf[:4])
    if magic != GGUF_MAGIC:
        if size < 4 and GGUF_MAGIC.startswith(magic):
            raise cur.truncated("the 4-byte magic", 4)
        raise cur.fail(
            f"wrong magic {magic!r} (a GGUF file starts with {GGUF_MAGIC!r}): this is not a GGUF file",
            hint="pass a .gguf file; older GGML/GGJT files must be converted with llama.cpp first",
        )
    cur.pos = 4
    version = cur.u32("the version field of the header")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise cur.fail(
                f"is a big-endian GGUF (version {swapped}); only little-endian files are supported",
                hint="convert it again for a little-endian host with llama.cpp's convert_hf_to_gguf.py",
            )
        raise cur.fail(
            f"unsupported GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})",
            hint="convert the model again with a current llama.cpp (convert_hf_to_gguf.py writes version 3)",
        )
    tensor_count = cur.u64("the tensor count in the header")
    kv_count = cur.u64("the metadata key/value count in the header")
    left = size - cur.pos
    tensor_bytes, kv_bytes = tensor_count * _MIN_TENSOR_INFO_BYTES, kv_count * _MIN_KV_BYTES
    if tensor_bytes > left:
        raise cur.fail(
            f"the header claims {tensor_count} tensors, which cannot fit in a file of {size} bytes "
            f"(each tensor info needs at least {_MIN_TENSOR_INFO_BYTES} bytes): {_why(tensor_bytes, 'header')}"
        )
    if kv_bytes > left:
        raise cur.fail(
            f"the header claims {kv_count} metadata key/value pairs, which cannot fit in a file of {size} "
            f"bytes (each needs at least {_MIN_KV_BYTES} bytes): {_why(kv_bytes, 'header')}"
        )
    if tensor_bytes + kv_bytes > left:
        raise cur.fail(
            f"the header claims {tensor_count} tensors and {kv_count} metadata pairs, which together cannot "
            f"fit in a file of {size} bytes: {_why(tensor_bytes + kv_bytes, 'header')}"
        )

    metadata: dict[str, Any] = {}
    for i in range(kv_count):
        key = cur.string(f"metadata key #{i}", strict=True)
        assert key is not None
        if key in metadata:
            raise cur.fail(f"metadata key {key!r} appears twice")
        value_type = cur.u32(f"the value type of metadata key {key!r}")
        metadata[key] = cur.value(value_type, f"the value of metadata key {key!r}")

    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise cur.fail(
            "has no general.architecture string in its metadata, so nothing says what model it holds",
            hint="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, (bool, float, _Array, str)) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment is {alignment!r}; it must be a positive power of two")

    tensors = _walk_tensor_infos(cur, tensor_count, alignment)
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    _check_tensor_data(cur, tensors, data_start)

    quant: dict[str, int] = {}
    for t in tensors:
        quant[t.ggml_type] = quant.get(t.ggml_type, 0) + 1
    tokens = metadata.get("tokenizer.ggml.tokens")
    context_length = metadata.get(f"{architecture}.context_length")
    name = metadata.get("general.name")
    info = GGUFInfo(
        path=str(path),
        version=version,
        tensor_count=tensor_count,
        kv_count=kv_count,
        architecture=architecture,
        name=name if isinstance(name, str) else None,
        quantization_types=dict(sorted(quant.items())),
        context_length=int(context_length) if isinstance(context_length, int) else None,
        vocab_size=tokens.count if isinstance(tokens, _Array) else None,
        has_chat_template=isinstance(metadata.get("tokenizer.chat_template"), str),
        file_size=size,
        sha256=sha256_file(path),
    )
    return _Scan(info, metadata, tensors)


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, elements per block, bytes per block), from the gguf package."""
    try:
        import gguf
    except ImportError as exc:
        raise MissingExtraError("gguf", "llm", "Reading GGUF files") from exc
    sizes = gguf.GGML_QUANT_SIZES
    return {int(t): (t.name, *sizes[t]) for t in gguf.GGMLQuantizationType if t in sizes}


def _walk_tensor_infos(cur: _Cursor, tensor_count: int, alignment: int) -> list[_Tensor]:
    types = _ggml_types()
    tensors: list[_Tensor] = []
    seen: set[str] = set()
    for i in range(tensor_count):
        name = cur.string(f"the name of tensor #{i}", strict=True)
        assert name is not None
        if name in seen:
            raise cur.fail(f"tensor name {name!r} appears twice")
        seen.add(name)
        n_dims = cur.u32(f"the rank of tensor {name!r}")
        if n_dims > GGML_MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions; ggml allows at most {GGML_MAX_DIMS}")
        dims = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
        elements = 1
        for d in dims:
            elements *= d  # Python ints: the product itself cannot overflow here, only be too big
        if any(d > _INT64_MAX for d in dims) or elements > _INT64_MAX:
            raise cur.fail(
                f"tensor {name!r} has dims {list(dims)} whose product ({elements}) overflows a 64-bit signed "
                f"element count: the tensor info is corrupt"
            )
        type_id = cur.u32(f"the ggml type of tensor {name!r}")
        offset = cur.u64(f"the data offset of tensor {name!r}")
        if type_id not in types:
            raise cur.fail(
                f"tensor {name!r} has unknown ggml type {type_id}",
                hint="the file may need a newer gguf package (pip install -U gguf), or it is damaged",
            )
        type_name, block, block_bytes = types[type_id]
        if dims and dims[0] % block:
            raise cur.fail(
                f"tensor {name!r} ({type_name}) has rows of {dims[0]} elements, not a multiple of its block "
                f"size {block}: the tensor info is corrupt"
            )
        if offset % alignment:
            raise cur.fail(
                f"tensor {name!r} starts at data offset {offset}, not a multiple of the alignment {alignment}"
            )
        tensors.append(_Tensor(name, dims, type_name, offset, elements // block * block_bytes))
    return tensors


def _check_tensor_data(cur: _Cursor, tensors: list[_Tensor], data_start: int) -> None:
    """Every tensor's bytes lie inside the file, and no two tensors share bytes."""
    size = cur.size
    for t in tensors:
        start = data_start + t.offset
        end = start + t.nbytes
        if end > size:
            raise cur.fail(
                f"tensor {t.name!r} (dims {list(t.dims)}, {t.ggml_type}) needs bytes {start}..{end} but the file "
                f"ends at byte {size}: its data lies past the end of the file (the file is truncated, or the "
                f"tensor's offset or dims are corrupt)",
                hint="fetch the file again and compare its size or sha256 with the source's",
            )
    previous: _Tensor | None = None
    for t in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        if previous is not None and t.offset < previous.offset + previous.nbytes:
            raise cur.fail(f"the data of tensors {previous.name!r} and {t.name!r} overlap: the tensor table is corrupt")
        previous = t


# --- to a transformers folder -------------------------------------------------------------------
def supported_architectures() -> list[str]:
    """GGUF architectures (``general.architecture``) the installed transformers reads into a causal LM.

    Its GGUF config mapping also lists T5 (an encoder-decoder) and ``deci`` (remote code only), which
    ``AutoModelForCausalLM`` cannot build; they are left out, so the list is what would actually work.
    """
    names: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import (
            GGUF_SUPPORTED_ARCHITECTURES,
        )
    except ImportError:
        GGUF_SUPPORTED_ARCHITECTURES = []
    for arch in GGUF_SUPPORTED_ARCHITECTURES:
        if arch not in ("general", "tokenizer"):  # mapping sections, not architectures
            names.add(_GGUF_SPELLING.get(arch, arch))
    try:  # transformers >= 5.25 reads these natively, keeping blocks packed
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS

        names.update(GGUF_ARCHS)
    except ImportError:
        pass
    try:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal,
        )
    except ImportError:
        return sorted(names)
    return sorted(a for a in names if _MODEL_TYPE.get(a, a) in causal)


def gguf_to_folder(path: Path, dest: Path) -> Path:
    """Turn the GGUF at ``path`` into a plain float32 transformers model folder at ``dest``.

    The folder holds config.json, model.safetensors, generation_config.json, the tokenizer files (with
    the chat template) and ``edgekit_source.json``, which records the GGUF's path, sha256, its
    :class:`GGUFInfo` and the quantization types the weights were dequantized from. Weights are
    dequantized once here, so every later edgekit step starts from the same floats. The folder is built
    beside ``dest`` and renamed into place: ``dest`` is either the old folder or the complete new one.
    ``dest`` may be missing, an empty folder, or an earlier output of this function (replaced).
    """
    path, dest = Path(path), Path(dest)
    scan = _scan(path)
    info = scan.info
    torch, transformers = _require_llm_stack()
    _check_loadable(path, scan)
    _check_dest(dest)

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        model = _load_float_model(path, info, torch, transformers)
        tokenizer = _load_tokenizer(path, scan, transformers)
        vocab = int(model.config.vocab_size)
        if len(tokenizer) > vocab:
            raise ModelLoadError(
                f"GGUF file {path}: its tokenizer has {len(tokenizer)} tokens but the model's vocab size is "
                f"{vocab}: ids past {vocab - 1} would index outside the embedding",
                hint="the tokenizer and weights come from different models: convert the GGUF again from one model",
            )
        model.save_pretrained(tmp)
        if not (tmp / "generation_config.json").is_file():
            transformers.GenerationConfig.from_model_config(model.config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "source": "gguf",
            "gguf_path": str(path.resolve()),
            "sha256": info.sha256,
            "gguf": asdict(info),
            "dequantized_from": info.quantization_types,
            "dtype": "float32",
            "model_class": type(model).__name__,
            "transformers_version": transformers.__version__,
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _check_loadable(path: Path, scan: _Scan) -> None:
    """Refuse, before any heavy work, what transformers cannot turn into a working model."""
    info, metadata = scan.info, scan.metadata
    arch = info.architecture
    supported = supported_architectures()
    if arch not in supported:
        raise ModelLoadError(
            f"GGUF file {path}: architecture {arch!r} cannot be read from GGUF by the installed transformers "
            f"as a causal LM; these can: {', '.join(supported)}",
            hint="use the model's original transformers checkpoint (a folder with config.json) as the source instead",
        )
    split_count = metadata.get("split.count")
    if isinstance(split_count, int) and split_count > 1:
        raise ModelLoadError(
            f"GGUF file {path} is one shard of a {split_count}-file split model",
            hint="merge the shards first: llama-gguf-split --merge <first-shard>.gguf merged.gguf",
        )
    if info.vocab_size is None:
        raise ModelLoadError(
            f"GGUF file {path} has no tokenizer.ggml.tokens, so it carries no tokenizer",
            hint="convert the model again with llama.cpp's convert_hf_to_gguf.py, which embeds the tokenizer",
        )
    # The embedding's rows are the model's vocab size; llama.cpp refuses a token list of another length.
    embed = next((t for t in scan.tensors if t.name == "token_embd.weight"), None)
    model_vocab = embed.dims[1] if embed is not None and len(embed.dims) >= 2 else None
    stated = metadata.get(f"{arch}.vocab_size")
    if model_vocab is None and isinstance(stated, int) and not isinstance(stated, bool):
        model_vocab = stated
    if model_vocab is not None and info.vocab_size != model_vocab:
        raise ModelLoadError(
            f"GGUF file {path}: its tokenizer has {info.vocab_size} tokens but the model's vocab size is "
            f"{model_vocab} (rows of token_embd.weight)",
            hint="the tokenizer and weights come from different models: convert the GGUF again from one model",
        )


def _check_dest(dest: Path) -> None:
    """Refuse to replace a folder this function did not write: it may be the user's data."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise OutputError(f"output {dest} exists and is not a folder", hint="choose another destination")
    if any(dest.iterdir()) and not (dest / SOURCE_FILE).is_file():
        raise OutputError(
            f"output folder {dest} is not empty and is not an earlier GGUF conversion ({SOURCE_FILE} missing)",
            hint="choose a new or empty folder, or remove this one",
        )


def _publish(tmp: Path, dest: Path) -> None:
    """Rename the finished folder into place; an earlier conversion at ``dest`` is swapped out whole."""
    if dest.exists():
        _check_dest(dest)
        old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except BaseException:
            os.replace(old, dest)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)


def _require_llm_stack() -> tuple[Any, Any]:
    import importlib.util

    purpose = "Converting a GGUF file to a transformers model"
    torch = require("torch", "llm", purpose)
    transformers = require("transformers", "llm", purpose)
    require("gguf", "llm", purpose)
    if importlib.util.find_spec("accelerate") is None:  # transformers refuses gguf_file= without it
        raise MissingExtraError("accelerate", "llm", purpose)
    return torch, transformers


def _load_float_model(path: Path, info: GGUFInfo, torch: Any, transformers: Any) -> Any:
    """The GGUF's weights, dequantized, in a plain float32 model with no quantizer attached.

    transformers loads a GGUF through its GGUF quantizer, and a model that carries one refuses
    ``save_pretrained``; so the architecture is rebuilt from the config and the weights moved over.
    """
    kwargs: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True, "dtype": torch.float32}
    if hasattr(transformers, "GgufConfig"):  # >= 5.25: ask for every weight unpacked, never packed blocks
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), **kwargs)
    except Exception as exc:  # the third-party boundary: whatever transformers raises on this file
        if isinstance(exc, EdgekitError):
            raise
        raise ModelLoadError(
            f"GGUF file {path} (architecture {info.architecture!r}) could not be loaded by transformers "
            f"{transformers.__version__}: {exc}",
            hint="use the model's original transformers checkpoint as the source, or a GGUF converted by a "
            "current llama.cpp",
        ) from exc
    loaded.eval()
    if getattr(loaded, "hf_quantizer", None) is None and getattr(loaded.config, "quantization_config", None) is None:
        return loaded

    import copy

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    state = loaded.state_dict()
    bad = sorted(k for k, v in state.items() if not torch.is_floating_point(v))
    if bad:
        raise ModelLoadError(
            f"GGUF file {path}: transformers left {len(bad)} weights packed (e.g. {bad[0]}) instead of dequantizing",
            hint="upgrade transformers, or report the file's quantization types: " + ", ".join(info.quantization_types),
        )
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        plain.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"GGUF file {path}: the dequantized weights do not fit a {type(plain).__name__} built from the "
            f"file's own config: {exc}",
            hint="the file's metadata and tensors disagree: convert it again with a current llama.cpp",
        ) from exc
    plain.generation_config = copy.deepcopy(loaded.generation_config)
    del loaded, state
    return plain.eval()


def _load_tokenizer(path: Path, scan: _Scan, transformers: Any) -> Any:
    """The tokenizer transformers rebuilds from the GGUF's metadata, chat template included."""
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
    except Exception as exc:  # the third-party boundary, as for the model
        if isinstance(exc, EdgekitError):
            raise
        tok_type = scan.metadata.get("tokenizer.ggml.model")
        raise ModelLoadError(
            f"GGUF file {path}: transformers {transformers.__version__} cannot rebuild its tokenizer "
            f"(tokenizer.ggml.model={tok_type!r}): {exc}",
            hint="use the model's original transformers checkpoint (with tokenizer.json) as the source instead",
        ) from exc
    template = scan.metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
    return tokenizer
