"""ONNX -> OpenVINO IR (``.xml`` graph + ``.bin`` weights, one artifact of two files), for OpenVINO's CPU
plugin: fp32, the CPU's own default precision, and INT8 through NNCF post-training quantization.

What the CPU plugin computes in is an inference hint, not a property of the file: the IR keeps fp32
weights in every float variant, and records the precision the variant means in its rt_info
(``edgekit/inference_precision``: ``f32``, or ``auto`` = the plugin's default, bf16 on CPUs with
AVX-512 BF16/AMX, fp16 on ARM cores with fp16 arithmetic, f32 elsewhere). The agent's
``OpenVINORunner`` applies it and reports the precision it actually ran at; parity is judged at that
precision's tolerance (bf16 looser than f32), and ``ship/runtime.json`` spells the hint out.

INT8 is ``nncf.quantize`` on the user's calibration set (preset ``performance``: symmetric
activations; fast bias correction; ``ignored_scope`` names layers kept in float). NNCF inserts
FakeQuantize nodes that the CPU plugin runs as INT8 kernels; the layers left in float run at the
plugin's default precision.

Parity runs the IR on this host through the agent's own runner, fed as the device feeds it, against
onnxruntime running the ONNX model.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..agent.inprocess import load_agent
from ..artifact import Artifact, LineageStep
from ..errors import ConversionError, MissingExtraError
from ..formats import Format, companion_clash
from ..fsutil import publish_files
from ..inputs.source import model_batch, ort_once, ort_reference_all, run_batched, synthetic_inputs
from ..inputs.stateful import Stream, feeds, stream_of
from ..inputs.stateful import run as run_stream
from ..logs import quiet
from .fold_stream import fold_stream
from .parity import compare_outputs, parity_metrics

HOP = "onnx->openvino"
PRECISIONS = ("fp32", "auto", "int8")
CALIBRATION_SAMPLES = 300  # NNCF's default subset size
RT_KEY = ["edgekit", "inference_precision"]
# the runner's reported precision -> edgekit's parity tolerance row
_PARITY_ROW = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}


class OpenvinoConfig(BaseModel):
    """Options of the ONNX -> OpenVINO hop (the recipe's ``convert: {to: openvino, ...}`` step)."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "auto", "int8"] = "fp32"
    calibration_samples: int = Field(CALIBRATION_SAMPLES, ge=1, description="int8: calibration samples (first N)")
    preset: Literal["performance", "mixed"] = Field(
        "performance", description="int8: NNCF's preset (performance: symmetric activations; mixed: asymmetric)")
    ignored_scope: list[str] = Field(default_factory=list,
                                     description="int8: layer names NNCF keeps in float (e.g. the sensitive ones)")
    parity_bar: Literal["precision", "breakage"] = Field(
        "precision", description="auto (when it runs below f32) and int8: 'precision' holds the IR to that "
        "precision's parity tolerances (edgekit convert, which has no metric); 'breakage' only to the "
        "gross-breakage bar (parity.TOLERANCES['breakage']), leaving its quality to the metric that the search's "
        "host check and the gate judge next (PP-OCRv4's recognizer in bf16: cosine 0.9969 < 0.998 on its CTC "
        "logits, every string read as in fp32)")

    @property
    def label(self) -> str:
        return {"fp32": "fp32 (f32 hint)", "auto": "the CPU's default precision", "int8": "INT8 (NNCF)"}[self.precision]


def available() -> bool:
    return importlib.util.find_spec("openvino") is not None


def no_telemetry() -> None:
    """Keep OpenVINO and NNCF offline: both report usage through ``openvino_telemetry`` (Google Analytics,
    a client id and counters under ~/intel), and NNCF sends it without asking when no consent file exists.
    Edgekit never reaches the network at run time, so the package is made unimportable for this process
    before either is imported; both then fall back to their own no-op stubs (checked: no ~/intel files)."""
    if "openvino_telemetry" not in sys.modules:
        sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]  (import raises ImportError)


def _nncf_dataset(calib: list[np.ndarray], names: list[str], batch: int | None, samples: int,
                  stream: Stream | None = None, onnx_path: Path | None = None):
    """NNCF's dataset: the first ``samples`` calibration samples in the model's batch (1 when dynamic). With a
    ``stream``, each sample's whole feed: the constants beside it and, for a stateful model, the state the
    float ONNX model carried to it (calibrated on the state in use, not on zeros)."""
    import nncf

    n = min(samples, len(calib[0]))
    size = batch or 1
    if stream is not None:
        once = ort_once(onnx_path)[0]
        items = [dict(zip(names, feed)) for feed in feeds(once, [np.asarray(x[:n]) for x in calib], stream)]
        return nncf.Dataset(items), len(items)
    items = []
    for k in range(0, n - n % size if n >= size else 0, size):
        items.append({name: np.ascontiguousarray(x[k:k + size]) for name, x in zip(names, calib)})
    if not items:
        raise ConversionError(f"INT8 calibration needs at least {size} samples (the model's batch), got {n}", hop=HOP,
                              hint="pass a larger --calib-data")
    return nncf.Dataset(items), len(items) * size


def run_ir_all(path: Path, io, xs: list[np.ndarray], threads: int = 1, *, stream: Stream | None = None
               ) -> tuple[list[np.ndarray], str]:
    """Every output of the IR on ``xs`` in ``io.outputs`` order, through the agent's OpenVINORunner (in
    chunks of its batch), and the precision the plugin ran at. With a ``stream``, ``xs`` are the data's
    inputs, fed beside the constants and the carried state as the agent feeds them."""

    agent = load_agent()
    ins = [s.model_dump(mode="json") for s in io.inputs]
    outs = [s.model_dump(mode="json") for s in io.outputs]
    try:
        runner = agent.runners.RUNNERS["openvino"](str(path), threads, ins, outs)
    except agent.AgentFailure as exc:
        raise ConversionError(f"the IR does not load in OpenVINO's CPU plugin: {exc}", hop=HOP) from exc

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        got = runner.run([agent.tensors.prepare(x, s) for x, s in zip(feed, ins)])
        return [agent.tensors.restore_output(y, s) for y, s in zip(got, outs)]

    if stream is not None:
        return run_stream(once, list(xs), stream), runner.options["inference_precision"]
    return run_batched(once, list(xs), runner.static_batch()), runner.options["inference_precision"]


def onnx_to_openvino(art: Artifact, out_path: str | Path, cfg: OpenvinoConfig, *, parity_inputs: list[np.ndarray],
                     calib: list[np.ndarray] | None = None, parity_samples: int = 64) -> Artifact:
    """The ONNX artifact as an IR at ``out_path`` (``.xml``; the ``.bin`` beside it), parity-checked."""
    if not available():
        raise MissingExtraError("openvino", "openvino", "ONNX -> OpenVINO conversion")
    if art.format != Format.ONNX:
        raise ConversionError(f"OpenVINO conversion starts from the ONNX model, got {art.format.value}", hop=HOP)
    out_path = Path(out_path)
    if out_path.suffix != ".xml":
        raise ConversionError(f"{out_path.name}: an OpenVINO IR is saved as a .xml (its .bin beside it)", hop=HOP,
                              hint="use --out model.xml")
    clash = companion_clash(out_path, Format.OPENVINO)
    if clash is not None:
        raise ConversionError(f"{out_path.with_suffix('.bin').name} holds the weights of {clash.name}, another model beside "
                              f"it: writing the OpenVINO model there would break that one", hop=HOP,
                              hint=f"choose another name than {out_path.stem} (e.g. --out {out_path.stem}-openvino{out_path.suffix})")
    if cfg.precision == "int8" and not calib:
        raise ConversionError("OpenVINO INT8 (NNCF post-training quantization) is calibrated on your data, and none "
                              "was given", hop=HOP, hint="pass --calib-data CALIB.npz, or convert at fp32/auto")
    no_telemetry()
    import openvino as ov


    start = time.perf_counter()
    stream = stream_of(art)
    config = {"precision": cfg.precision, "converter": "openvino", "openvino": ov.__version__}
    metrics: dict = {}
    with tempfile.TemporaryDirectory(prefix="edgekit-ov-fold-") as fold_dir:
        read_from = art.path
        if stream is not None and stream.constants:  # a branch on a constant input (Silero's sample rate)
            folded = fold_stream(art.path, stream, list(parity_inputs), Path(fold_dir) / "folded.onnx")
            config["fold_stream"] = folded
            if "skipped" not in folded:
                read_from = Path(fold_dir) / "folded.onnx"
        try:
            model = ov.Core().read_model(str(read_from))
        except Exception as exc:  # the ONNX frontend names the op it has no translation for
            raise ConversionError(f"OpenVINO cannot read the ONNX model: {str(exc).strip().splitlines()[-1][:300]}",
                                  hop=HOP, hint="an op above has no OpenVINO translation; keep this model on "
                                  "onnxruntime") from exc
    if cfg.precision == "int8":
        import nncf

        names = [s.name for s in art.io.inputs]
        batch = model_batch([s.shape for s in art.io.inputs])
        dataset, used = _nncf_dataset(list(calib), names, batch, cfg.calibration_samples, stream, art.path)
        scope = nncf.IgnoredScope(names=list(cfg.ignored_scope), validate=True) if cfg.ignored_scope else None
        try:
            with quiet("nncf", "openvino"):
                model = nncf.quantize(model, dataset, preset=getattr(nncf.QuantizationPreset, cfg.preset.upper()),
                                      subset_size=used, fast_bias_correction=True,
                                      **({"ignored_scope": scope} if scope else {}))
        except Exception as exc:
            raise ConversionError(f"NNCF quantization failed: {type(exc).__name__}: {str(exc).strip()[:300]}",
                                  hop=HOP, hint="check ignored_scope names against the model's layer names") from exc
        config.update(quantizer=f"nncf {nncf.__version__} quantize (preset {cfg.preset}, fast bias correction)",
                      ignored_scope=list(cfg.ignored_scope))
        metrics["calibration_samples"] = used
    model.set_rt_info("f32" if cfg.precision == "fp32" else "auto", RT_KEY)
    seconds = time.perf_counter() - start
    probe = [np.asarray(x[:parity_samples]) for x in parity_inputs]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_path.stem}.", dir=out_path.parent))
    try:  # both files written and checked aside, then moved in: the .bin first, the .xml (the model) last
        tmp_xml = tmp / out_path.name
        ov.save_model(model, str(tmp_xml), compress_to_fp16=False)  # fp32 weights: the precision is the hint's
        gots, ran_at = run_ir_all(tmp_xml, art.io, probe, stream=stream)
        refs = ort_reference_all(art.path)(probe) if stream is None else run_stream(ort_once(art.path)[0], probe, stream)
        results = compare_outputs(refs, gots, "onnxruntime (the ONNX model)", [o.name for o in art.io.outputs])
        row = "int8" if cfg.precision == "int8" else _PARITY_ROW.get(ran_at, "fp32")
        if cfg.parity_bar == "breakage" and row != "fp32":  # an IR that runs at f32 still matches fp32's bar
            row = "breakage"
        pm = parity_metrics(results, row)
        publish_files([(tmp_xml, out_path), (tmp_xml.with_suffix(".bin"), out_path.with_suffix(".bin"))])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    metrics.update(pm, route="openvino", precision=cfg.precision, inference_precision=ran_at, parity_tolerance=row,
                   convert_seconds=round(seconds, 3), chain_parity=pm["parity"])
    step = LineageStep(kind="convert", name=HOP, config=config, metrics=metrics,
                       seconds=round(time.perf_counter() - start, 3))
    return art.derive(out_path, fmt=Format.OPENVINO, io=art.io, step=step, precision=cfg.precision)


def openvino_hop(h) -> Artifact:
    """The registry's hop (``formats.FORMATS``' openvino row): a ``convert.hops.HopInput`` in. Parity runs
    on the eval inputs, else the calibration inputs, else seeded synthetic ones."""

    cfg = h.config if h.config is not None else OpenvinoConfig(precision=h.precision)
    calib = list(h.calib.xs) if h.calib is not None else None
    stream = stream_of(h.artifact)
    xs = h.parity_inputs or calib or synthetic_inputs(h.artifact.io if stream is None else stream.data_io(h.artifact.io))
    h.progress(f"converting ONNX -> OpenVINO IR ({cfg.label})")
    return onnx_to_openvino(h.artifact, h.out, cfg, parity_inputs=list(xs), calib=calib)


__all__ = ["OpenvinoConfig", "onnx_to_openvino", "openvino_hop", "run_ir_all", "available", "HOP", "PRECISIONS"]
