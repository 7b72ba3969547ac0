"""A language model as edgekit reads it: a transformers model folder (config.json, weights, tokenizer files),
read offline with remote code off, or a GGUF file (``gguf_source.py`` turns it into such a folder first).

The task is recognised from the config (an architecture ``*ForCausalLM`` is text generation) and named in
the report. Weights come from safetensors, or from a pickle only through ``torch.load(weights_only=True)``
(transformers' loader). A folder whose config needs its own code, a tokenizer that does not fit the model's
vocabulary, or a folder without weights is refused by name (exit 2), before any export."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MissingExtraError, ModelLoadError
from ..fsutil import sha256_files
from ..paths import cache_dir
from .gguf_source import check_gguf, gguf_to_folder

TASK = "text-generation"
# files shipped beside the model file: what `edgekit run ship/` and an application need to tokenize and chat
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
)


@dataclass
class LMSource:
    """The float model and what travels with it."""

    path: Path  # what the user named (a folder, or a .gguf file)
    folder: Path  # the transformers folder read (for a GGUF: edgekit's converted copy)
    config: Any  # transformers PretrainedConfig
    model: Any  # the float torch model, eval mode
    tokenizer: Any
    architecture: str  # e.g. LlamaForCausalLM
    family: str  # config.model_type, e.g. llama, qwen2
    parameters: int
    files: list[Path] = field(default_factory=list)  # tokenizer, chat template, generation config
    origin: dict[str, Any] = field(default_factory=dict)  # a GGUF's provenance
    sha256: str | None = None  # over config.json and the weight files (a GGUF: the file's own)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 2048)

    @property
    def layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads)

    @property
    def head_dim(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads)

    def describe(self) -> dict[str, Any]:
        return {
            "source": str(self.path),
            "sha256": self.sha256,
            "task": TASK,
            "architecture": self.architecture,
            "family": self.family,
            "parameters": self.parameters,
            "vocab_size": self.vocab_size,
            "context": self.context,
            "layers": self.layers,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "dtype": str(getattr(self.config, "dtype", None) or "float32").replace("torch.", ""),
            **({"origin": self.origin} if self.origin else {}),
        }


def is_lm_source(path: str | Path) -> bool:
    """A folder with a config.json naming a causal LM, or a .gguf file: the language-model path."""
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return True
    cfg = p / "config.json"
    if not (p.is_dir() and cfg.is_file()):
        return False
    try:
        archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError):
        return True  # a broken config in a model folder: load_lm says what is wrong
    return is_causal(archs)


# transformers names its text-generation heads *ForCausalLM, and the oldest ones (GPT-2, OpenAI GPT, CTRL)
# *LMHeadModel
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def is_causal(archs: list[Any]) -> bool:
    return any(str(a).endswith(CAUSAL_SUFFIXES) for a in archs)


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(
            f"{folder} has no config.json: not a transformers model folder",
            hint="point edgekit at the folder save_pretrained() wrote, or at a .gguf file",
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def check_folder(folder: Path) -> dict[str, Any]:
    """The refusals that need no import of transformers: remote code, no causal LM, no weights."""
    data = _read_config(folder)
    if data.get("auto_map") or any(
        "auto_map" in json.loads(p.read_text(encoding="utf-8") or "{}")
        for p in [folder / "tokenizer_config.json"]
        if p.is_file()
    ):
        raise ModelLoadError(
            f"{folder} needs its own Python code (config.json or tokenizer_config.json has an "
            f"auto_map: {sorted((data.get('auto_map') or {}))}); edgekit never runs a model "
            "folder's code",
            hint="use an architecture transformers ships (Llama, Qwen2/3, Gemma, Phi...), or convert the model to one",
        )
    archs = [str(a) for a in data.get("architectures") or []]
    if not is_causal(archs):
        raise ModelLoadError(
            f"{folder}/config.json names architectures {archs or 'none'}: not a causal language "
            "model (*ForCausalLM or *LMHeadModel)",
            hint="the language-model path reads text-generation models",
        )
    weights = [p for p in folder.iterdir() if p.suffix == ".safetensors" or p.name.startswith("pytorch_model")]
    if not weights:
        raise ModelLoadError(
            f"{folder} has no weights (model.safetensors or pytorch_model*.bin)",
            hint="save the model with save_pretrained() into this folder",
        )
    return data


def linears_from_conv1d(model: Any) -> int:
    """GPT-2's family computes its projections with transformers' ``Conv1D`` (``x @ W + b``, W stored [in, out]),
    which no exporter or quantizer here treats as a linear layer: ONNX gets a Gemm that MatMulNBits skips,
    torchao and the int8 pass see no ``nn.Linear``, and every "int8" file of such a model would quantize nothing.
    Each becomes the ``nn.Linear`` it is (weight = W transposed; the same function) before anything reads the
    model. Returns how many were replaced."""
    import torch
    from transformers.pytorch_utils import Conv1D

    swaps = [(n, m) for n, m in model.named_modules() if isinstance(m, Conv1D)]
    for name, conv in swaps:
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        lin = torch.nn.Linear(conv.weight.shape[0], conv.weight.shape[1], bias=conv.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(conv.weight.T)
            if conv.bias is not None:
                lin.bias.copy_(conv.bias)
        setattr(parent, name.rpartition(".")[2], lin.eval())
    return len(swaps)


def load_lm(path: str | Path) -> LMSource:
    """Read the model, its tokenizer and the files that ship with it; every refusal is exit 2."""
    p = Path(path)
    origin: dict[str, Any] = {}
    if p.suffix.lower() == ".gguf":
        info = check_gguf(p)
        folder = cache_dir("gguf") / info.sha256[:24]
        if not (folder / "config.json").is_file():
            gguf_to_folder(p, folder)
        origin = {"gguf": str(p), "sha256": info.sha256, "quantization": info.quantization_types}
    elif p.is_dir():
        folder = p
    elif not p.exists():
        raise ModelLoadError(f"{p} does not exist")
    else:
        raise ModelLoadError(f"{p} is neither a transformers model folder nor a .gguf file")
    data = check_folder(folder)
    try:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise MissingExtraError("transformers", "llm", "reading a language model") from exc
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # unannotated in transformers
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelLoadError(
            f"transformers cannot read {folder}/config.json (model_type {data.get('model_type')!r}): {exc}",
            hint="this transformers version may not know the architecture; pip install -U "
            "transformers, or convert the model",
        ) from exc
    try:
        with torch.no_grad():
            model = AutoModelForCausalLM.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False, dtype=torch.float32
            ).eval()  # type: ignore[no-untyped-call]  # the auto class's eval() is unannotated in transformers
    except (ValueError, OSError, RuntimeError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the weights in {folder}: {exc}") from exc
    linears_from_conv1d(model)
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"cannot read the tokenizer in {folder}: {exc}",
            hint="a model folder ships its tokenizer files (tokenizer.json, tokenizer_config.json)",
        )
    if len(tok) > config.vocab_size:
        raise ModelLoadError(
            f"the tokenizer in {folder} has {len(tok)} tokens but the model's vocabulary has "
            f"{config.vocab_size}: token ids past {config.vocab_size - 1} have no embedding",
            hint="the tokenizer files do not belong to these weights; ship the model's own",
        )
    files = [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]
    weights = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" or p.name.startswith("pytorch_model"))
    digest = origin.get("sha256") or sha256_files([folder / "config.json", *weights])
    return LMSource(
        path=p,
        folder=folder,
        config=config,
        model=model,
        tokenizer=tok,
        architecture=str((config.architectures or [type(model).__name__])[0]),
        family=str(config.model_type),
        parameters=sum(t.numel() for t in model.parameters()),
        files=files,
        origin=origin,
        sha256=digest,
    )


def render_chat(tokenizer: Any, prompt: str) -> str | None:
    """The user's prompt in the model's chat template (transformers renders it in a sandboxed Jinja
    environment); None when the tokenizer has no template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        return str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        )
    except Exception as exc:  # a template that fails to render (a sandbox violation included) is named
        raise ModelLoadError(f"the model's chat template does not render: {type(exc).__name__}: {exc}") from exc
