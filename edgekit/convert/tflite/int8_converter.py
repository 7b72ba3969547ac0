"""INT8 .tflite files made with TensorFlow's ``TFLiteConverter`` from onnx2tf's SavedModel: dynamic-range
(weights only) or full-integer, calibrated on a representative dataset built from the user's calibration set
(builtin INT8 kernels only, so the result runs on a plain LiteRT interpreter; onnx2tf's own INT8 path adds TF
"Flex" ops and falls back to downloaded sample images)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...artifact import IOSpec
from ...errors import ConversionError
from ...inputs.data import Dataset
from ...inputs.source import model_batch
from .config import HOP, TfliteConfig


def _signature_keys(saved_model: Path) -> list[str]:
    import tensorflow as tf  # heavy: TensorFlow

    loaded = tf.saved_model.load(str(saved_model))
    sig = loaded.signatures["serving_default"]
    return list(sig.structured_input_signature[1].keys())


def _quantize(saved_model: Path, cfg: TfliteConfig, io: IOSpec, onnx_names: list[str],
              calib: Dataset | None) -> bytes:
    """The INT8 .tflite's bytes (``cfg.quantization``: full-integer or dynamic-range)."""
    import tensorflow as tf  # heavy: TensorFlow

    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if cfg.quantization == "full":
        keys = _signature_keys(saved_model)
        if len(keys) != len(io.inputs):
            raise ConversionError(f"the SavedModel takes {len(keys)} inputs, the model {len(io.inputs)}", hop=HOP)
        order = []
        for i, name in enumerate(onnx_names):  # onnx2tf keeps input names, minus ':' and '/'
            cands = [name, name.replace(":", "_").replace("/", "_"), name.replace(":", "__").replace("/", "_")]
            order.append(next((c for c in cands if c in keys), keys[i]))
        xs = [x[: cfg.calibration_samples] for x in calib.xs]  # type: ignore[union-attr]
        batch = model_batch([s.shape for s in io.inputs]) or 1  # the graph's static batch size

        def representative() -> Iterator[dict[str, np.ndarray]]:
            n = len(xs[0])
            for i in range(0, n, batch):
                idx = i + np.arange(batch) % min(batch, n - i)  # the last batch padded with its own samples
                sample = {}
                for key, x, spec in zip(order, xs, io.inputs):
                    v = np.asarray(x[idx], dtype=np.float32)
                    sample[key] = np.transpose(v, spec.transpose) if spec.transpose else v
                yield sample

        conv.representative_dataset = representative
        if not cfg.per_channel:  # one scale per weight tensor (TensorFlow's converter option; private, stable)
            conv._experimental_disable_per_channel = True
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if cfg.allow_float_fallback:
            ops.append(tf.lite.OpsSet.TFLITE_BUILTINS)
        conv.target_spec.supported_ops = ops
        if cfg.io == "int8":
            conv.inference_input_type = tf.int8
            conv.inference_output_type = tf.int8
    return conv.convert()
