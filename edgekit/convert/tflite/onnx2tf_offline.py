"""onnx2tf run offline, in a folder of its own. onnx2tf 1.28 fetches a sample-image .npy from the internet
while converting models with 4-D 3-channel inputs: edgekit writes that file (built from the user's own data)
into the conversion's working folder, where onnx2tf looks first, and swaps onnx2tf's download function for a
local loader during the call, so a conversion never reaches the network. A finished run is kept for the
process (``onnx2tf_runs.py``), and a failure is reported as the ONNX node it was converting
(``onnx2tf_errors.py``)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ...errors import ConversionError
from ...logs import quiet
from .. import onnx2tf_runs
from ..onnx2tf_errors import describe_node, failing_node, log_tail, onnx2tf_failure
from .config import HOP

SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"  # what onnx2tf looks for in the cwd
_CWD_LOCK = threading.Lock()  # onnx2tf reads the sample file from the process-wide cwd


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    with _CWD_LOCK:
        old = os.getcwd()
        os.chdir(path)
        try:
            yield
        finally:
            os.chdir(old)


def _sample_images(xs: list[np.ndarray] | None) -> np.ndarray:
    """The 20x?x?x3 NHWC float32 array onnx2tf wants, from the user's first input when it is an
    image batch (NCHW, 3 channels), else deterministic noise. onnx2tf resizes it to the input size."""
    if xs:
        x = np.asarray(xs[0], dtype=np.float32)
        if x.ndim == 4 and x.shape[1] == 3:
            x = x.transpose(0, 2, 3, 1)
        if x.ndim == 4 and x.shape[-1] == 3:
            reps = int(np.ceil(20 / len(x)))
            return np.ascontiguousarray(np.concatenate([x] * reps)[:20])
    return np.random.default_rng(0).standard_normal((20, 128, 128, 3)).astype(np.float32)


@contextlib.contextmanager
def _offline_onnx2tf(sample_path: Path) -> Iterator[None]:
    """Replace onnx2tf's sample-data download by a loader of our local file for the call."""
    import onnx2tf.onnx2tf as o2t_main  # heavy: TensorFlow
    import onnx2tf.utils.common_functions as o2t_common

    def local_sample() -> np.ndarray:
        return np.load(sample_path, allow_pickle=False)

    saved = [(m, getattr(m, "download_test_image_data", None)) for m in (o2t_main, o2t_common)]
    for m, _ in saved:
        m.download_test_image_data = local_sample
    try:
        yield
    finally:
        for m, fn in saved:
            if fn is not None:
                m.download_test_image_data = fn


def run_onnx2tf(kwargs: dict[str, Any], work: Path, sample: Path, prepared: Any, renamed: dict[str, str],
                hint: str) -> bool:
    """onnx2tf's SavedModel and fp32/fp16 files under ``work / "tf"``, from ``kwargs``' input file (``prepared``:
    that model, ``renamed``: the node names edgekit changed, both to name a failing node); True when an identical
    run of this process was reused (another candidate of a search ran it already)."""
    with quiet("onnx2tf", "tensorflow", "absl"):
        import onnx2tf  # heavy: TensorFlow

    src = Path(kwargs["input_onnx_file_path"])
    run_key = onnx2tf_runs.key(src, kwargs, sample, getattr(onnx2tf, "__version__", "?"))
    reused = onnx2tf_runs.restore(run_key, work / "tf")
    if not reused:
        with _in_dir(work), quiet("onnx2tf", "tensorflow", "absl") as buf, _offline_onnx2tf(sample):
            try:
                onnx2tf.convert(**kwargs)
            except SystemExit as exc:  # onnx2tf reports errors and calls sys.exit(1)
                node = describe_node(prepared, failing_node(exc, buf.getvalue()), renamed)
                raise ConversionError(f"onnx2tf stopped{f' at {node}' if node else ''}: "
                                      f"{log_tail(buf.getvalue()) or f'exit status {exc.code}'}", hop=HOP,
                                      hint=hint) from None
            except Exception as exc:  # converter internals raise anything; name the node and the cause
                raise ConversionError(onnx2tf_failure(exc, buf.getvalue(), prepared, renamed), hop=HOP,
                                      hint=hint) from exc
        if not (work / "tf" / "model_float32.tflite").is_file():
            raise ConversionError(f"onnx2tf wrote no .tflite ({log_tail(buf.getvalue())})", hop=HOP)
        onnx2tf_runs.keep(run_key, work / "tf")
    return reused
