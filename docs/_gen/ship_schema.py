"""The ship contract as models, for the reference page: ``ship/ship.json`` and ``ship/runtime.json``.

edgekit writes both as plain dicts (``edgekit/orchestration/ship.py: write_ship``,
``edgekit/llm/ship.py: write_lm_ship``); these models describe them. They forbid unknown keys so that
``tests/unit/test_docs_examples.py``, which validates what ``write_ship`` writes against them, fails when edgekit
adds a key this page does not describe.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Quantization(_Doc):
    """An integer tensor's quantization: real = scale * (q - zero_point)."""

    scale: float = Field(description="the tensor's scale")
    zero_point: int = Field(description="the tensor's zero point")


class TensorEntry(_Doc):
    """One input or output of the shipped file, and the source model's tensor it stands for."""

    name: str = Field(description="the tensor's name in the shipped file (e.g. `serving_default_x:0` in a TFLite file)")
    source_name: str = Field(
        description="the source model's name for it: `edgekit run` and `run_shipped` feed and "
        "return tensors by these names"
    )
    dtype: str = Field(description="numpy dtype the file takes or gives")
    source_dtype: str = Field(description="numpy dtype of the source model's tensor")
    shape: list[int | None] = Field(
        description="the shape as the source model takes or gives it (null: a dynamic axis)"
    )
    layout: str | None = Field(None, description="e.g. `NCHW`, `NHWC`; null when not an image tensor")
    transpose: list[int] | None = Field(
        None,
        description="the permutation from the source's layout to the file's: "
        "feed `np.transpose(x, transpose)`; an output comes back with the inverse",
    )
    static_shape: list[int] | None = Field(
        None, description="inputs only: the static shape a fixed-shape file was converted at, in the source's layout"
    )
    static_shape_from: Literal["user", "data"] | None = Field(
        None, description="where `static_shape` came from: `--input-shape` or the eval/calibration data"
    )
    quantization: Quantization | None = Field(None, description="an int8-I/O file's scale and zero point")
    role: Literal["constant", "state"] | None = Field(
        None,
        description="inputs only: fed by the contract itself, not by the caller (a `--const` or a `--state` input)",
    )


class StateLink(_Doc):
    """A streaming model's state: the input starts as zeros and takes the named output after each call."""

    output: str = Field(description="the model output that holds the next state")
    input: str = Field(description="the model input it is fed back to")
    shape: list[int] = Field(description="the zeros it starts from")
    dtype: str = Field(description="numpy dtype of the state")


class Interface(_Doc):
    """How to call the file without edgekit's help (a fixed-graph model)."""

    inputs: list[TensorEntry] = Field(description="every input, in the file's order")
    outputs: list[TensorEntry] = Field(description="every output, in the file's order")
    batch: int | None = Field(
        description="the batch the file takes (null: any); a file with a static batch is fed "
        "that many samples a call; 1 for a model with state"
    )
    constants: dict[str, Any] | None = Field(
        None, description="streaming models: input name -> the value fed unchanged with every call (`--const`)"
    )
    state: list[StateLink] | None = Field(
        None, description="streaming models: the state carried call to call (`--state OUTPUT:INPUT`)"
    )
    order: str | None = Field(None, description="streaming models with state: the order samples must be fed in")


class ShapeBucket(_Doc):
    """One sample shape of the eval data (shape buckets) the file was scored and timed at."""

    shapes: Any = Field(description="per input, the sample shape (no batch axis)")
    samples: int = Field(description="eval samples of this shape")
    p50_ms: float | None = Field(description="median latency at this shape, ms")


class Measured(_Doc):
    """The figures the device measured for the shipped file (fixed-graph models: latency and the task metric;
    language models: generation and quality)."""

    p50_ms: float | None = Field(None, description="median latency, ms (fixed-graph models)")
    accuracy: float | None = Field(None, description="the task metric's value on the eval set")
    accuracy_drop: float | None = Field(None, description="the metric's drop against the baseline, in its units")
    weighted_p50_ms: float | None = Field(None, description="shape buckets: p50 weighted by each shape's samples")
    by_shape: list[ShapeBucket] | None = Field(None, description="shape buckets: the shapes it was scored and timed at")
    decode_tokens_per_s: float | None = Field(None, description="language models: decode speed from an empty cache")
    ttft_ms: float | None = Field(None, description="language models: time to first token, ms")
    perplexity: float | None = Field(None, description="language models: perplexity on the eval text")
    kld_mean: float | None = Field(
        None, description="language models: mean KL divergence from the float model, nats/token"
    )
    peak_rss_mb: float | None = Field(None, description="language models: peak resident memory, MB")


class Generator(_Doc):
    """Language models: what the tokenizer and the generation loop need."""

    context: int = Field(description="the context length the file was built and measured for")
    vocab_size: int = Field(description="the vocabulary's size")
    architecture: str | None = Field(None, description="the transformers architecture, e.g. `LlamaForCausalLM`")
    family: str | None = Field(None, description="the model family, e.g. `llama`")
    tokenizer_files: list[str] = Field(description="the tokenizer and generation-config files shipped beside it")
    chat_template: bool = Field(description="whether the tokenizer carries a chat template")
    bos_token_id: int | None = Field(None, description="beginning-of-sequence token")
    eos_token_id: int | list[int] | None = Field(None, description="end-of-sequence token(s)")
    calling: dict[str, Any] = Field(
        description="how the file is called: its inputs and outputs and how its KV cache is held (per format)"
    )


class EvalWindows(_Doc):
    """Language models: how the eval text was windowed (`edgekit run ship/ --eval-text` windows it the same)."""

    window: int | None = Field(description="tokens per scored window")
    windows: int | None = Field(description="windows scored")


class ShipManifest(_Doc):
    """`ship/ship.json`: what the shipped file is, how to call it and what was measured."""

    schema_: int = Field(alias="schema", description="the ship contract's version (2: `interface`)")
    task: Literal["text-generation"] | None = Field(
        None, description="`text-generation` for a language model; absent for a fixed-graph model"
    )
    variant: str = Field(description="the variant that ships (its name in the report)")
    file: str = Field(description="the main model file (the runtime opens it; read it beside ship.json)")
    files: list[str] = Field(
        description="every file of the model (OpenVINO's `.bin` beside its `.xml`; a language model's tokenizer files)"
    )
    sha256: str = Field(description="the model's hash (covers every file of a multi-file model)")
    set_sha256: str | None = Field(
        None,
        description="the hash of the whole shipped file set (the model's files and a language model's tokenizer files)",
    )
    format: str = Field(description="`onnx`, `tflite`, `executorch`, `openvino`, `ncnn`, `gguf`, ...")
    precision: str = Field(description="`fp32`, `fp16`, `int8`, `int4`, `mixed`, ...")
    runtime: str | None = Field(None, description="the runtime it was measured on (runtime.json says how to set it up)")
    interface: Interface | None = Field(None, description="fixed-graph models: how to call the file")
    generator: Generator | None = Field(None, description="language models: tokenizer and generation settings")
    eval: EvalWindows | None = Field(None, description="language models: the eval text's windowing")
    lineage: list[dict[str, Any]] = Field(
        description="the steps that made the file (source, conversions, passes), "
        "with their configs and metrics: the report's `lineage`"
    )
    measured: Measured = Field(description="the device's figures for this file")


class NothingShipped(_Doc):
    """`ship/ship.json` after a deploy that shipped nothing (no variant inside the gate): the model files an
    earlier run shipped there are removed with its `runtime.json`, and `edgekit run` on the folder answers that
    nothing shipped, with this reason, instead of running a file the new report does not stand behind."""

    schema_: int = Field(alias="schema", description="the ship contract's version")
    task: Literal["fixed-graph", "text-generation"] = Field(description="the kind of model the run deployed")
    shipped: Literal[False] = Field(description="always `false` here: a shipped file's ship.json has no such key")
    reason: str = Field(description="the decision's reason: why no variant shipped")
    report: str = Field(description="the report.json of the run that shipped nothing")


class RuntimeConfig(_Doc):
    """`ship/runtime.json`: how the application loads the shipped file to run it as it was measured."""

    runtime: str = Field(description="the runtime, e.g. `onnxruntime`, `litert`, `openvino`, `llama.cpp`")
    version: str | None = Field(description="the runtime's version on the device")
    threads: int | None = Field(description="the threads it was measured with")
    options: dict[str, Any] = Field(
        description="the runtime options it was measured with (e.g. `graph_optimization_level`, `xnnpack`, `api`)"
    )
    delegate: str | None = Field(None, description="the delegate, where the runtime has one (fixed-graph models)")
    file: str = Field(description="the model file's name in ship/")
    apply: dict[str, Any] | None = Field(
        description="the runtime API call and every setting that reproduces the "
        "measured speed, defaults spelled out (null for a runtime the agent does not "
        "run)"
    )
