"""Model formats edgekit knows, and how a file's format is recognised: the format/runtime registry.

``FORMATS`` is the one table: a row (``FormatSpec``) a format says its file suffixes, the runtime
that runs it on a device (the agent's runner of that name), the hop that makes it (``module:function``
taking a ``convert.hops.HopInput``) and from which format, the precisions and hop options it takes,
the variants it adds to a target's recipe and to the search, the language-model files it adds to
the generation race, the pip extra and packages doctor checks,
and the loader when edgekit can start from such a file. ``SUFFIXES``, ``RUNTIME_FOR_FORMAT`` and
the rest are derived from it. Adding a runtime = a ``Format`` member and a row here, the agent's
runner (``device_agents/edgekit_agent/runners/``) and the hop module.

This module imports nothing heavy (the hops and loaders are named, imported when used).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import ModelLoadError


class Format(str, Enum):
    TORCH = "torch"  # a torch.export program (.pt2) or an in-memory nn.Module
    ONNX = "onnx"
    TFLITE = "tflite"
    COREML = "coreml"
    EXECUTORCH = "executorch"
    OPENVINO = "openvino"
    NCNN = "ncnn"
    GGUF = "gguf"  # llama.cpp's file: language models only (edgekit/llm/export_gguf.py)


@dataclass(frozen=True)
class Candidate:
    """A variant a format contributes: ``passes`` as (pass name, config) pairs. Without calibration
    data a ``needs_calib`` candidate is skipped, or, with ``without_calib``, made with that update to
    its last pass's config (e.g. dynamic-range instead of full-integer INT8)."""

    name: str
    passes: tuple[tuple[str, dict], ...]
    needs_calib: bool = False
    without_calib: dict | None = None
    # one of the few measured most likely to win: `edgekit deploy` without a recipe runs a short
    # search over these (``--search`` tries every candidate)
    quick: bool = False
    # a search of its own (the accuracy-aware ladder: trials until one meets the tolerance, or the
    # deadline): built after every single-shot candidate, with the build time they left, so on a large
    # model it cannot use up the budget before the cheap candidates exist (measured on PP-OCRv4's
    # recognizer: its layer sensitivity alone is ~5 s a tensor x 558 tensors)
    open_ended: bool = False
    # the short search's float fallback: built (after the others) only when none of its full-INT8 candidates kept
    # the accuracy on the host, where the next-fastest file needs no calibration (OpenVINO at the CPU's default
    # precision: bf16 on x86 with AVX-512 BF16/AMX, ~1.8-2x ORT fp32 here; fp16 on ARMv8.2)
    fallback: bool = False
    # /proc/cpuinfo flags that put it in the short search from the start where the device is this host (the local
    # target): OpenVINO's default precision is bf16 where the CPU computes it natively, AMX tiles or AVX-512 BF16
    # dot products (PP-OCRv4's detector, 1 thread for the baseline: on a Xeon with AMX 2.31x fp32 against the short
    # search's best, tflite-dynamic, at 1.49x, its recognizer 5.2x; on an AMD EPYC with AVX-512 BF16 and no AMX,
    # openvino-auto@t2 2.77x against tflite-dynamic@t2's 1.94x, benchmarks/pretrained_zoo.py)
    quick_on_cpu: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationCandidate:
    """A language-model file a format contributes to the generation race (``llm/race.py``), as
    ``search_candidates`` are a fixed graph's: ``build`` names the factory ("module:function", called with
    ``args``) that returns its builder (``llm/candidates.Build``). ``quick``: in the default deploy's short race
    (``--search`` races every row); ``baseline``: the float file the others are compared with."""

    name: str
    precision: str
    build: str
    args: tuple[object, ...] = ()
    exporter: str = ""  # the host package its export needs ("": the runtime's own package)
    module: str = ""  # the runtime's Python module (local target: it runs here when this imports); "": the runtime
    slow: bool = False  # a slow lowering (race.py: started only when its prediction can beat the measured leader)
    calibrated: bool = False  # its file depends on the int4 ladder's Calibration: part of its cache key
    quick: bool = False
    baseline: bool = False


def _lm(name: str, precision: str, factory: str, *args: object, **kw: Any) -> GenerationCandidate:
    return GenerationCandidate(name, precision, f"edgekit.llm.candidates:{factory}", args, **kw)


@dataclass(frozen=True)
class Package:
    """A Python distribution a format needs on this host, as `edgekit doctor` reports it."""

    dist: str
    purpose: str
    extra: str = "core"  # the pip extra that installs it ("core": edgekit itself)


@dataclass(frozen=True)
class Tuning:
    """The runtime options the search's tuning stage tries (variant_search/tuning.py), as the agent's
    runner takes them (its OPTIONS; what each means is said there)."""

    options: tuple[tuple[str, tuple], ...] = ()  # option -> its values, the runtime's default first
    multi_thread_only: tuple[str, ...] = ()  # tried only above one thread (e.g. an inter-op pool)
    implied: tuple[tuple[str, object, str], ...] = ()  # (option, value, option sent = the setting's threads)
    short: tuple[tuple[str, str], ...] = ()  # the candidate table's short names


@dataclass(frozen=True)
class FormatSpec:
    format: Format
    label: str  # for people: "TFLite", "Core ML"
    suffixes: tuple[str, ...]  # the first is the one edgekit writes
    runtime: str | None = None  # the device runtime (the agent's runner name); None: not run on a device
    agent_runs: bool = True  # the device agent measures it (Core ML is profiled on macOS, not by the agent)
    hop: str | None = None  # "module:function" (HopInput -> Artifact) making this format; None: not a target
    hop_from: Format | None = None  # the format that hop reads (earlier hops are chained to reach it)
    hop_config: str | None = None  # "module:Class": the hop's typed options (built from precision + options)
    precisions: tuple[str, ...] = ("fp32",)
    precision_hint: str = ""  # what to do instead of an unsupported precision
    precision_note: str = ""  # what the precisions mean for this format (error messages)
    parity_hint: str = ""  # what to check when this hop is out of parity tolerance
    options: tuple[str, ...] = ()  # format-only options of the `convert` step / `edgekit convert`
    default_variants: tuple[Candidate, ...] = ()  # added to a recipe without convert steps for targets preferring it
    search_candidates: tuple[Candidate, ...] = ()
    # the language-model files this format contributes to the generation race (the same table, the other workload)
    generation_candidates: tuple[GenerationCandidate, ...] = ()
    search_skip: str | None = None  # why the search cannot measure it ({runtime} is filled in)
    extra: str | None = None  # pip extra with its converter/runtime
    packages: tuple[Package, ...] = ()
    source_loader: str | None = None  # "module:function" (Path -> Source) when edgekit can start from it
    is_dir: bool = False  # saved as a folder (.mlpackage)
    # files beside the main one, same stem (OpenVINO's .bin weights beside the .xml): the model is the set;
    # delivery, both caches and ship/ carry every file, and the sha256 covers them all
    companions: tuple[str, ...] = ()
    # "module:function" (threads, options) -> dict: the runtime API settings that reproduce a measured
    # setting, for ship/runtime.json (None: the agent does not run this format)
    ship_apply: str | None = None
    tuning: Tuning = Tuning()  # runtime options the search tunes (none: threads only)

    @property
    def suffix(self) -> str:
        return self.suffixes[0]


def _q(**cfg) -> tuple[str, dict]:
    return ("quantize", cfg)


def _convert(**cfg) -> tuple[tuple[str, dict], ...]:
    return (("convert", cfg),)


_TFLITE_OPTIONS = ("quantization", "io", "calibration_samples", "allow_float_fallback", "keep_input_layout",
                   "parity_bar", "input_shapes", "pseudo_ops")

FORMATS: tuple[FormatSpec, ...] = (
    FormatSpec(
        format=Format.TORCH, label="PyTorch", suffixes=(".pt2",),
        packages=(Package("torch", "PyTorch models, export"),),
        source_loader="edgekit.inputs.source:load_pt2",
    ),
    FormatSpec(
        format=Format.ONNX, label="ONNX", suffixes=(".onnx",), runtime="onnxruntime",
        hop="edgekit.convert.hops:torch_to_onnx_hop", hop_from=Format.TORCH,
        precision_hint="quantize it with a `quantize` step (`edgekit deploy` recipe), or convert to tflite",
        parity_hint="an op exports with different numerics; check the model in eval() mode and the opset",
        # ONNX Runtime INT8 encodings differ a lot in speed by CPU (VNNI or not, QDQ fusion or not): the
        # search measures a few rungs of the INT8 ladder (see variant_search/candidates.py). Measured here
        # (AVX-512 VNNI, onnxruntime 1.32, 1 thread; benchmarks/int8_ladder.py): U8S8 is the fast one, S8S8 QDQ
        # (per-tensor or per-channel) is slower than fp32; QOperator U8S8 is within a few % of QDQ U8S8 on the
        # zoo MobileNetV2 and faster on the zoo LeViT (0.72x vs 0.62x fp32), which ort-int8-mixed's host speed
        # probe picks when the host is the device. fp16 ONNX (pass quantize_fp16) is no candidate: the CPU EP
        # runs it at ~0.6-0.9x fp32 on x86 (measured here). quick (the default deploy's short search): U8S8,
        # the ladder (rescues quality) and dynamic (transformers); the S8S8 encodings are left to --search.
        search_candidates=(
            Candidate("ort-int8-default", (_q(mode="static", format="qdq", per_channel=False),), True),
            Candidate("ort-int8-qdq-s8s8", (_q(mode="static", format="qdq", per_channel=True),), True),
            Candidate("ort-int8-qdq-u8s8", (_q(mode="static", format="qdq", per_channel=False,
                                               activation_type="uint8"),), True, quick=True),
            # the accuracy-aware ladder: fastest encoding, calibration methods, mixed precision (needs --eval-data)
            Candidate("ort-int8-mixed", (("quantize_accuracy_aware", {}),), True, quick=True, open_ended=True),
            Candidate("ort-int8-dynamic", (_q(mode="dynamic"),), False, quick=True),
        ),
        # a language model's ONNX Runtime files (llm/export_onnx.py): the float baseline, int8 weights computed in
        # int8, MatMulNBits 4-bit in blocks of 32 and of 128 (fewer scales read per weight: 1.37x blocks of 32 on
        # the 125M Llama, KLD 0.028 vs 0.020, benchmarks/llm_runtimes.py), each int4 from a layer plan with the
        # recovery ladder (llm/int4_ladder.py)
        generation_candidates=(
            _lm("ort-fp32", "fp32", "ort", "fp32", quick=True, baseline=True),
            _lm("ort-int8", "int8", "ort", "int8", quick=True),
            _lm("ort-int4", "int4", "ort_int4", 32, calibrated=True, quick=True),
            _lm("ort-int4-b128", "int4", "ort_int4", 128, calibrated=True, quick=True),
        ),
        packages=(Package("onnx", "ONNX models"), Package("onnxruntime", "ONNX Runtime (host and local agent)"),
                  Package("onnxscript", "torch -> ONNX exporter")),
        source_loader="edgekit.inputs.source:load_onnx", ship_apply="edgekit.orchestration.ship:onnxruntime_apply",
        # checked against onnxruntime 1.32's SessionOptions; parallel mode runs independent nodes on an
        # inter-op pool (of the setting's threads), which one thread does not have
        tuning=Tuning(options=(("graph_optimization_level", ("all", "extended", "basic")),
                               ("execution_mode", ("sequential", "parallel"))),
                      multi_thread_only=("execution_mode",),
                      implied=(("execution_mode", "parallel", "inter_op_threads"),),
                      short=(("graph_optimization_level", "opt"), ("execution_mode", "mode"),
                             ("inter_op_threads", "inter"))),
    ),
    FormatSpec(
        format=Format.TFLITE, label="TFLite", suffixes=(".tflite",), runtime="litert",
        hop="edgekit.convert.hops:to_tflite_hop", hop_from=Format.ONNX,
        hop_config="edgekit.convert.onnx_to_tflite:TfliteConfig",
        precisions=("fp32", "fp16", "int8"), options=_TFLITE_OPTIONS,
        default_variants=(
            Candidate("tflite-fp32", _convert(to="tflite", precision="fp32")),
            Candidate("tflite-int8", _convert(to="tflite", precision="int8", io="float"), True,
                      without_calib={"quantization": "dynamic"}),
        ),
        # quick: fp16 is left to --search (CPU kernels compute it in fp32: 1.17x slower than tflite-fp32 on
        # the digits CNN here, AVX-512 VNNI); fp32, full-integer and dynamic-range INT8 each won somewhere
        search_candidates=(
            Candidate("tflite-fp32", _convert(to="tflite", precision="fp32"), quick=True),
            # fp16 and INT8 search candidates face the host check's metric next: the converter holds them to the
            # gross-breakage parity bar only (onnx_to_tflite.TfliteConfig.parity_bar)
            Candidate("tflite-fp16", _convert(to="tflite", precision="fp16", parity_bar="breakage")),
            Candidate("tflite-int8", _convert(to="tflite", precision="int8", io="float", parity_bar="breakage"), True,
                      quick=True),
            Candidate("tflite-dynamic", _convert(to="tflite", precision="int8", quantization="dynamic",
                                                 parity_bar="breakage"), quick=True),
        ),
        extra="tflite",
        packages=(Package("tensorflow", "onnx2tf conversion", "tflite"), Package("onnx2tf", "ONNX -> TFLite", "tflite"),
                  Package("ai-edge-litert", "LiteRT interpreter", "tflite")),
        source_loader="edgekit.inputs.source:load_tflite", ship_apply="edgekit.orchestration.ship:litert_apply",
        tuning=Tuning(options=(("xnnpack", ("on", "off")), ("api", ("interpreter", "compiled")))),
    ),
    FormatSpec(
        format=Format.COREML, label="Core ML", suffixes=(".mlpackage", ".mlmodel"), runtime="coreml",
        agent_runs=False, hop="edgekit.convert.hops:torch_to_coreml_hop", hop_from=Format.TORCH,
        hop_config="edgekit.convert.torch_to_coreml:CoremlConfig",
        precisions=("fp32", "fp16", "int8"), precision_note="Core ML int8 is 8-bit weight compression",
        default_variants=tuple(Candidate(f"coreml-{p}", _convert(to="coreml", precision=p))
                               for p in ("fp32", "fp16", "int8")),
        search_skip="profiling {runtime} needs its own host (e.g. Core ML needs macOS)",
        extra="coreml", packages=(Package("coremltools", "Core ML conversion", "coreml"),),
        is_dir=True,
    ),
    FormatSpec(
        format=Format.EXECUTORCH, label="ExecuTorch", suffixes=(".pte",), runtime="executorch",
        hop="edgekit.convert.torch_to_executorch:executorch_hop", hop_from=Format.TORCH,
        hop_config="edgekit.convert.torch_to_executorch:ExecutorchConfig",
        precisions=("fp32", "int8"), options=("quantization", "calibration_samples"),
        precision_hint="ExecuTorch's XNNPACK delegate gets fp32 or int8 here",
        precision_note="ExecuTorch int8 is PT2E quantization (XNNPACK quantizer, per-channel weights): static "
        "activations calibrated on --calib-data, or --quantization dynamic",
        parity_hint="an op lowers with different numerics; the hop's lineage lists which ops XNNPACK took",
        search_candidates=(Candidate("executorch-fp32", _convert(to="executorch", precision="fp32"), quick=True),
                           Candidate("executorch-int8", _convert(to="executorch", precision="int8"), True,
                                     quick=True),
                           Candidate("executorch-dynamic", _convert(to="executorch", precision="int8",
                                                                    quantization="dynamic"))),
        # a language model's .pte files (llm/export_executorch.py, slow lowerings): 8da4w (torchao int4 weights in
        # groups, int8 activations per token) races by default; its float and int8 files were slower than its 8da4w
        # and ONNX Runtime's fp32 in every measured row (int8 weight-only ~2 tok/s on XNNPACK), g64 decoded 1.16x
        # g32 and g128 broke the prefill parity check on the 125M Llama (cosine 0.899): --search only
        generation_candidates=(
            _lm("et-fp32", "fp32", "et", "fp32", slow=True),
            _lm("et-8da8w", "8da8w", "et", "8da8w", slow=True),
            _lm("et-8da4w", "8da4w", "et_8da4w", 32, slow=True, calibrated=True, quick=True),
            _lm("et-int8", "int8", "et", "int8", slow=True),
            _lm("et-8da4w-g64", "8da4w", "et_8da4w", 64, slow=True, calibrated=True),
            _lm("et-8da4w-g128", "8da4w", "et_8da4w", 128, slow=True, calibrated=True),
        ),
        extra="executorch", ship_apply="edgekit.orchestration.ship:executorch_apply",
        packages=(Package("executorch", "PyTorch -> ExecuTorch (.pte) and its runtime", "executorch"),),
    ),
    FormatSpec(
        format=Format.OPENVINO, label="OpenVINO", suffixes=(".xml",), companions=(".bin",), runtime="openvino",
        hop="edgekit.convert.onnx_to_openvino:openvino_hop", hop_from=Format.ONNX,
        hop_config="edgekit.convert.onnx_to_openvino:OpenvinoConfig",
        precisions=("fp32", "auto", "int8"), options=("calibration_samples", "parity_bar"),
        precision_hint="OpenVINO IR is converted at fp32, auto (the CPU plugin's default precision) or int8 (NNCF)",
        precision_note="OpenVINO's float precision is an inference hint: fp32 runs at f32, auto at the CPU "
        "plugin's default (bf16 on CPUs with AVX-512 BF16/AMX, fp16 on ARM with fp16 arithmetic); int8 is NNCF "
        "post-training quantization calibrated on --calib-data",
        parity_hint="an op converts with different numerics in OpenVINO's ONNX frontend or CPU plugin",
        # --search only: measured here (x86, AVX-512 VNNI+BF16, 1 thread) OpenVINO did not win the short search's
        # place on the perf-style MobileNetV2 (auto 1.82x, NNCF INT8 1.83x ORT fp32 against TFLite INT8 3.22x) nor
        # on the digits CNN (its ~0.07 ms per-inference overhead); openvino-auto is the short search's fallback
        # where no INT8 file keeps the accuracy (a target's short_search may add any of them outright)
        # auto (below f32) and INT8 face the host check's metric next: the hop holds them to the gross-breakage
        # parity bar only (onnx_to_openvino.OpenvinoConfig.parity_bar)
        search_candidates=(Candidate("openvino-fp32", _convert(to="openvino", precision="fp32")),
                           Candidate("openvino-auto", _convert(to="openvino", precision="auto", parity_bar="breakage"),
                                     fallback=True, quick_on_cpu=("amx_bf16", "avx512_bf16")),
                           # NNCF's accuracy control (passes/quantize_nncf.py) is a recipe pass, not a candidate:
                           # 54 s on the perf-style MobileNetV2 where plain NNCF INT8 takes 5 s
                           Candidate("openvino-int8", _convert(to="openvino", precision="int8", parity_bar="breakage"),
                                     True)),
        extra="openvino", ship_apply="edgekit.orchestration.ship:openvino_apply",
        # THROUGHPUT lets the plugin pick streams; with one thread there is one stream either way
        tuning=Tuning(options=(("performance_hint", ("latency", "throughput")),),
                      multi_thread_only=("performance_hint",), short=(("performance_hint", "hint"),)),
        packages=(Package("openvino", "ONNX -> OpenVINO IR and its CPU runtime", "openvino"),
                  Package("nncf", "OpenVINO INT8 (post-training quantization)", "openvino")),
    ),
    FormatSpec(
        format=Format.NCNN, label="NCNN", suffixes=(".param",), companions=(".bin",), runtime="ncnn",
        hop="edgekit.convert.onnx_to_ncnn:ncnn_hop", hop_from=Format.ONNX,
        hop_config="edgekit.convert.onnx_to_ncnn:NcnnConfig",
        precisions=("fp32", "fp16"),
        precision_hint="NCNN is converted at fp32 or fp16 here; its INT8 tools (ncnn2table, ncnn2int8) are not in "
        "the ncnn/pnnx wheels",
        precision_note="NCNN fp16 is fp16 weights, storage and arithmetic (NCNN's default where the CPU has it); "
        "fp32 runs with every fp16 option off; batch 1, float inputs",
        parity_hint="an op converts with different numerics in pnnx or runs differently in NCNN",
        search_candidates=(Candidate("ncnn-fp32", _convert(to="ncnn", precision="fp32")),
                           Candidate("ncnn-fp16", _convert(to="ncnn", precision="fp16"))),
        extra="ncnn", ship_apply="edgekit.orchestration.ship:ncnn_apply",
        packages=(Package("ncnn", "NCNN runtime", "ncnn"), Package("pnnx", "ONNX -> NCNN converter", "ncnn")),
    ),
    # language models only: built by edgekit/llm/export_gguf.py (llama.cpp's converter and quantizer), run by the
    # agent's llama.cpp decoder; no fixed-graph hop makes it
    FormatSpec(
        format=Format.GGUF, label="GGUF (llama.cpp)", suffixes=(".gguf",), runtime="llama.cpp",
        precisions=("fp16", "int8", "int4"),
        # llama-quantize's files from one f16 conversion (llm/export_gguf.py), each with its per-tensor account
        generation_candidates=tuple(
            _lm(f"gguf-{t.lower()}", p, "gguf", t, exporter="llama.cpp", module="llama_cpp", quick=True)
            for t, p in (("Q8_0", "int8"), ("Q4_0", "int4"), ("Q4_K_M", "int4"))),
        search_skip="GGUF files are language models: `edgekit deploy MODEL_DIR --eval-text` races them",
    ),
)

_BY_FORMAT = {s.format: s for s in FORMATS}
_BY_RUNTIME = {s.runtime: s for s in FORMATS if s.runtime}


def format_spec(fmt: Format | str) -> FormatSpec:
    """The registry row of ``fmt`` (a Format or its value); KeyError for an unknown one."""
    return _BY_FORMAT[Format(fmt)]


def spec_for_runtime(runtime: str) -> FormatSpec | None:
    """The row whose device runtime is ``runtime`` (None for a runtime edgekit has no row for)."""
    return _BY_RUNTIME.get(runtime)


def model_files(path: str | Path, fmt: Format | str) -> list[Path]:
    """The files a model of ``fmt`` saved at ``path`` is made of: the main file, then its companions."""
    p = Path(path)
    return [p, *(p.with_suffix(sfx) for sfx in format_spec(fmt).companions)]


def companion_clash(path: str | Path, fmt: Format | str) -> Path | None:
    """The file of another format's model that saving a ``fmt`` model at ``path`` would break: OpenVINO's
    ``m.xml`` and NCNN's ``m.param`` both keep their weights in ``m.bin``. None when there is none."""
    p, own = Path(path), format_spec(fmt)
    for row in FORMATS:
        if row is not own and set(row.companions) & set(own.companions):
            other = p.with_suffix(row.suffix)
            if other.exists():
                return other
    return None


def load_named(ref: str):
    """The object a registry row names as ``"module:attribute"`` (imported when used)."""
    import importlib

    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


def convert_targets() -> tuple[str, ...]:
    """Formats a model can be converted to (`edgekit convert --to`, the recipe's `convert: {to: ...}`)."""
    return tuple(s.format.value for s in FORMATS if s.hop)


def all_precisions() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for s in FORMATS if s.hop for p in s.precisions))


def all_options() -> tuple[str, ...]:
    return tuple(dict.fromkeys(o for s in FORMATS for o in s.options))


# Derived views (kept importable with their old meaning).
SUFFIXES = {sfx: s.format for s in FORMATS for sfx in s.suffixes}

# Which runtime on the device runs which format.
RUNTIME_FOR_FORMAT = {s.format: s.runtime for s in FORMATS if s.runtime}


def detect_format(path: str | Path) -> Format:
    p = Path(path)
    fmt = SUFFIXES.get(p.suffix.lower())
    if fmt is None:
        if p.suffix.lower() in (".pt", ".pth", ".bin", ".ckpt"):
            raise ModelLoadError(
                f"{p.name}: a pickled PyTorch checkpoint needs its architecture",
                hint="pass --arch module:Class (loaded with torch.load(weights_only=True)), "
                "or save the model with torch.export.save(torch.export.export(model, example), 'model.pt2')",
            )
        raise ModelLoadError(
            f"{p.name}: unknown model format '{p.suffix or '(no suffix)'}'",
            hint="edgekit takes a torch.export program (.pt2), an ONNX file (.onnx), a .tflite, "
            "or a pickled state dict (.pt/.pth) with --arch module:Class",
        )
    return fmt


__all__ = ["Format", "FormatSpec", "Candidate", "Package", "Tuning", "FORMATS", "format_spec", "spec_for_runtime",
           "model_files", "load_named", "companion_clash",
           "convert_targets", "all_precisions", "all_options", "SUFFIXES", "RUNTIME_FOR_FORMAT", "detect_format"]
