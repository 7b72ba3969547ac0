"""NCNN: a ``.param``/``.bin`` pair (as pnnx writes them) on NCNN's CPU path, fp16 storage on or off."""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..protocol import EXIT_RUNTIME, AgentFailure, Doc
from .base import Runner, dist_version, no_op_profile, probe_installed


class NCNNRunner(Runner):
    """An NCNN model (``.param`` graph beside its ``.bin`` weights, as pnnx writes them) on NCNN's CPU
    path (Vulkan off). NCNN's Mat has no batch axis: the model takes one sample (batch 1) per input,
    float32, and its inputs and outputs are pnnx's blobs ``in0, in1, ...`` / ``out0, out1, ...`` in the
    source model's order.

    What NCNN computes in is an option, not the file: by default it stores and computes in fp16 where the
    CPU can (``use_fp16_storage``/``_arithmetic``/``_packed``: on, on x86 too); ``fp16: off`` turns all of
    them (and bf16) off for fp32. The hop pins the setting its variant means (the artifact's
    ``runtime_options``); the runner reports what it applied."""

    name = "ncnn"
    log_missing = False
    # checked against the ncnn 1.0.20261020 Python binding's Option
    OPTIONS = {"fp16": ("on", "off")}
    _FP16 = ("use_fp16_storage", "use_fp16_arithmetic", "use_fp16_packed")

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        return probe_installed("ncnn", "ncnn is not installed (pip install ncnn)")

    def load(self, model_path: str, request: Doc) -> None:
        threads = int(request.get("threads", 1))
        opts = self.check_options(request.get("runtime_options"))
        try:
            import ncnn
        except ImportError as exc:
            raise AgentFailure(
                "runtime_missing", f"ncnn is not installed on this device ({exc}); pip install ncnn", EXIT_RUNTIME
            ) from exc
        self.ncnn = ncnn
        self.version = dist_version("ncnn") or getattr(ncnn, "__version__", None)
        weights = (request.get("companions") or {}).get(".bin") or os.path.splitext(str(model_path))[0] + ".bin"
        net = ncnn.Net()
        net.opt.num_threads = threads  # ncnn's default is every core
        net.opt.use_vulkan_compute = False
        fp16 = opts.get("fp16", "on") == "on"
        for key in self._FP16:
            setattr(net.opt, key, fp16 and getattr(net.opt, key))
        if not fp16:
            net.opt.use_bf16_storage = net.opt.use_bf16_packed = False
        if net.load_param(str(model_path)) != 0 or net.load_model(str(weights)) != 0:
            raise AgentFailure(
                "model_load_failed",
                f"ncnn cannot load {model_path} with its weights {weights} (a .param/.bin pair pnnx wrote)",
                EXIT_RUNTIME,
            )
        self.net = net
        self.input_names = sorted(net.input_names(), key=self._index)
        self.output_names = sorted(net.output_names(), key=self._index)
        self.options = {"fp16": "on" if fp16 else "off"}
        self.threads = threads
        # NCNN drops unit axes (a (1, 1, 10) output comes back as 10 values): the host's output shapes restore them
        self.out_shapes = [tuple(s.get("shape") or ()) for s in request.get("outputs") or []]

    @staticmethod
    def _index(blob: Any) -> int:
        digits = "".join(c for c in str(blob) if c.isdigit())
        return int(digits) if digits else 0

    def static_batch(self) -> int | None:
        return 1  # NCNN's Mat has no batch axis

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        import numpy as np

        ex = self.net.create_extractor()
        for name, x in zip(self.input_names, feeds):
            x = np.ascontiguousarray(np.asarray(x, dtype=np.float32)[0])  # one sample: the batch axis dropped
            ex.input(name, self.ncnn.Mat(x).clone())
        outs: list[Any] = []
        for name in self.output_names:
            rc, mat = ex.extract(name)
            if rc != 0:
                raise RuntimeError(f"ncnn could not compute blob {name} (error {rc})")
            y = np.array(mat)
            shape = self.out_shapes[len(outs)] if len(outs) < len(self.out_shapes) else ()
            if shape and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == y.size:
                outs.append(y.reshape(shape))
            else:
                outs.append(y[None])
        return outs

    def profile(self, feeds: Sequence[Any], runs: int) -> Doc:
        return no_op_profile("NCNN's per-layer timer (NCNN_BENCHMARK) is compiled out of the PyPI wheels")
