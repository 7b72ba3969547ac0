"""LiteRT (TensorFlow Lite): a ``.tflite`` file on the Interpreter (ai_edge_litert, or tflite_runtime on
older devices) or on ai_edge_litert's CompiledModel; XNNPACK on or off."""

from __future__ import annotations

import sys
from typing import Any, Sequence

from ..protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc, first_line
from .base import Runner, no_op_profile

_XNN = ("xnnpack", "failed to prepare")


class LiteRTRunner(Runner):
    """A .tflite model on the LiteRT interpreter (ai_edge_litert; tflite_runtime on older devices),
    or on ai_edge_litert's CompiledModel (runtime option ``api: compiled``)."""

    name = "litert"
    log_missing = False
    PACKAGES = ("ai_edge_litert", "tflite_runtime")
    # Runtime options a search may vary, checked against ai_edge_litert 2.3.0:
    # - xnnpack "off": the Interpreter built with OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    #   (LiteRT's own kernels); the default (AUTO, or BUILTIN asked for as "on") applies the XNNPACK
    #   delegate at allocate_tensors. On a CompiledModel: CpuOptions(kernel_mode=BUILTIN) instead of
    #   the XNNPACK kernel mode. XNNPACK's thread count is the request's threads either way
    #   (Interpreter(num_threads=...), CpuOptions(num_threads=...)).
    # - api "compiled": the file runs through ai_edge_litert.compiled_model.CompiledModel (LiteRT's
    #   newer API: TensorBuffers, CPU accelerator options) instead of the Interpreter, with the same
    #   output contract. tflite_runtime has no CompiledModel (refused with that reason), and a
    #   tflite_runtime without OpResolverType cannot turn XNNPACK off from Python (refused too).
    OPTIONS = {"xnnpack": ("on", "off"), "api": ("interpreter", "compiled")}

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        errors: list[str] = []
        for mod in cls.PACKAGES:
            try:
                m = __import__(mod)
            except Exception as exc:
                errors.append(f"{mod}: {exc}")
                continue
            return f"{mod} {getattr(m, '__version__', '?')}", None
        return None, "; ".join(errors)

    def load(self, model_path: str, request: Doc) -> None:
        threads = int(request.get("threads", 1))
        opts = self.check_options(request.get("runtime_options"))
        input_specs, output_specs = request.get("inputs"), request.get("outputs")
        interp_mod: Any = None
        errors: list[str] = []
        for mod in (f"{p}.interpreter" for p in self.PACKAGES):
            try:
                interp_mod = __import__(mod, fromlist=["Interpreter"])
                self.module = mod.split(".")[0]
                break
            except ImportError as exc:
                errors.append(f"{mod}: {exc}")
                continue
        if interp_mod is None:
            raise AgentFailure(
                "runtime_missing",
                "no LiteRT interpreter on this device (pip install ai-edge-litert, or tflite-runtime "
                "on older devices): " + "; ".join(errors),
                EXIT_RUNTIME,
            )
        top = sys.modules.get(self.module)
        self.version = f"{self.module} {getattr(top, '__version__', '?')}"
        compiled = opts.get("api") == "compiled"
        xnnpack_off = opts.get("xnnpack") == "off"
        resolver: Any = getattr(interp_mod, "OpResolverType", None)
        if "xnnpack" in opts and resolver is None:
            raise AgentFailure(
                "bad_request",
                f"{self.version} has no OpResolverType: XNNPACK cannot be turned on or off from its Python API",
                EXIT_BAD_REQUEST,
            )
        kwargs: Doc = {}
        if compiled and resolver is not None:
            # only the model's tensor metadata (names, indices, quantization: CompiledModel's details
            # have no quantization) from an interpreter that is never allocated and applies no delegate
            kwargs["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        elif "xnnpack" in opts:
            kwargs["experimental_op_resolver_type"] = (
                resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES if xnnpack_off else resolver.BUILTIN
            )
        self.cm: Any = None
        try:
            self.interp = interp_mod.Interpreter(
                model_path=model_path, num_threads=1 if compiled else threads, **kwargs
            )
            if not compiled:
                self.interp.allocate_tensors()
        except Exception as exc:
            msg = str(exc)
            retry = not compiled and "xnnpack" not in opts and resolver is not None and self._delegate_failed(msg)
            if not retry:
                if "Select TensorFlow op" in msg or "Flex" in msg:
                    msg += " (the model uses TensorFlow 'Flex' ops, which the plain LiteRT interpreter cannot run)"
                raise AgentFailure(
                    "model_load_failed", f"LiteRT cannot load {model_path}: {msg}", EXIT_RUNTIME
                ) from exc
            # XNNPACK (applied by default) refused the graph at prepare: run it on LiteRT's own kernels, said
            # in the report and in the options the measurement (and ship/runtime.json) carries
            try:
                self.interp = interp_mod.Interpreter(
                    model_path=model_path,
                    num_threads=threads,
                    experimental_op_resolver_type=resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                )
                self.interp.allocate_tensors()
            except Exception as exc2:
                raise AgentFailure(
                    "model_load_failed",
                    f"LiteRT cannot load {model_path}: with XNNPACK: "
                    f"{first_line(msg, prefer=_XNN)}; without it: {first_line(str(exc2))}",
                    EXIT_RUNTIME,
                ) from exc2
            opts = {**opts, "xnnpack": "off"}
            self.warnings.append(
                f"XNNPACK failed to prepare the model ({first_line(msg, prefer=_XNN)}); measured with "
                "LiteRT's built-in kernels (xnnpack=off), which the application must set too"
            )
        self.threads = threads
        self.inputs = self.in_spec_order(self.interp.get_input_details(), input_specs or [])
        # outputs in the host's order (the source model's), matched by the TFLite tensor names the host
        # recorded: the interpreter's own order can differ for a multi-output model
        self.outputs = self.in_spec_order(self.interp.get_output_details(), output_specs or [])
        if compiled:
            self.interp = None  # metadata read; the CompiledModel runs the graph
            self._load_compiled(model_path, threads, xnnpack_off)
            self.delegate = None if xnnpack_off else "xnnpack"
        else:
            self.delegated_nodes = self._delegated_nodes()
            self.delegate = "xnnpack" if self.delegated_nodes else None
        self.options = opts

    @staticmethod
    def _delegate_failed(msg: str) -> bool:
        """Whether an Interpreter error is the XNNPACK delegate's ("Node number 7 (TfLiteXNNPackDelegate)
        failed to prepare", "Failed to apply XNNPACK delegate"), not the model's own."""
        low = msg.lower()
        return "xnnpack" in low and ("prepare" in low or "delegate" in low)

    def _delegated_nodes(self) -> int | None:
        """How many nodes of the allocated graph a delegate took (XNNPACK, the Interpreter's only
        default delegate); None where the interpreter cannot list its ops."""
        try:
            return sum(1 for op in self.interp._get_ops_details() if op.get("op_name") == "DELEGATE")
        except Exception:  # a private API (tflite_runtime builds differ): unknown, not a failure
            return None

    def _load_compiled(self, model_path: str, threads: int, xnnpack_off: bool) -> None:
        import numpy as np

        if self.module != "ai_edge_litert":
            raise AgentFailure(
                "bad_request",
                f"api 'compiled' needs ai_edge_litert's CompiledModel; {self.version} has only the Interpreter",
                EXIT_BAD_REQUEST,
            )
        try:
            import ai_edge_litert.compiled_model as cmm
        except ImportError as exc:
            raise AgentFailure(
                "bad_request",
                f"api 'compiled' needs ai_edge_litert.compiled_model, which {self.version} does not have ({exc})",
                EXIT_BAD_REQUEST,
            ) from exc
        cpu = cmm.CpuOptions(num_threads=threads, kernel_mode=cmm.CpuKernelMode.BUILTIN if xnnpack_off else None)
        try:
            cm = cmm.CompiledModel.from_file(
                model_path, options=cmm.Options(hardware_accelerators=cmm.HardwareAccelerator.CPU, cpu_options=cpu)
            )
            sigs = cm.get_signature_list()
            key = next(iter(sigs))
            self._sig = cm.get_signature_index(key)
            ins, outs = cm.get_input_tensor_details(key), cm.get_output_tensor_details(key)
            # the signature's keys are not the tensor names (onnx2tf: "x" vs "serving_default_x:0"):
            # its tensors are matched to the interpreter's by tensor index
            in_idx = [int(ins[k]["index"]) for k in sigs[key]["inputs"]]
            out_idx = [int(outs[k]["index"]) for k in sigs[key]["outputs"]]
            if sorted(in_idx) != sorted(int(d["index"]) for d in self.inputs) or sorted(out_idx) != sorted(
                int(d["index"]) for d in self.outputs
            ):
                raise ValueError(f"its first signature {key!r} does not have the graph's inputs and outputs")
            self._in_pos = [in_idx.index(int(d["index"])) for d in self.inputs]
            self._reads = [
                (
                    out_idx.index(int(d["index"])),
                    int(np.prod(d["shape"])),
                    np.dtype(d["dtype"]),
                    tuple(int(v) for v in d["shape"]),
                )
                for d in self.outputs
            ]
            self._in_bufs, self._out_bufs = cm.create_input_buffers(self._sig), cm.create_output_buffers(self._sig)
            for pos, n, dtype, _ in self._reads:  # a dtype TensorBuffer cannot carry fails here, not mid-run
                self._out_bufs[pos].read(n, dtype)
        except AgentFailure:
            raise
        except Exception as exc:
            raise AgentFailure(
                "model_load_failed", f"LiteRT's CompiledModel cannot load {model_path}: {exc}", EXIT_RUNTIME
            ) from exc
        self.cm = cm
        self.fully_accelerated = bool(cm.is_fully_accelerated())

    @staticmethod
    def in_spec_order(details: Sequence[Doc], specs: Sequence[Doc]) -> list[Doc]:
        """The interpreter's inputs in the order of the host's specs (user data order), matched by the
        TFLite tensor name the host recorded; interpreter order otherwise."""
        by_name = {d["name"]: d for d in details}
        names = [s.get("name") for s in specs]
        if len(names) == len(details) and all(n in by_name for n in names):
            return [by_name[n] for n in names]
        return list(details)

    def batch_dynamic(self) -> bool:
        return False  # TFLite graphs have a fixed batch (1 is the norm)

    def static_batch(self) -> int | None:
        shape = list(self.inputs[0]["shape"]) if self.inputs else []
        return int(shape[0]) if shape and int(shape[0]) > 0 else 1

    @staticmethod
    def _quant(det: Doc) -> tuple[float | None, int | None]:
        q = det.get("quantization") or (0.0, 0)
        return (float(q[0]), int(q[1])) if q and q[0] else (None, None)

    def _feed(self, np: Any, det: Doc, x: Any) -> Any:
        want = np.dtype(det["dtype"])
        x = np.asarray(x)
        if want.kind in "iu" and x.dtype.kind == "f":
            # float data for an integer input that the host sent no scale for: use the tensor's own
            scale, zp = self._quant(det)
            if scale is None:
                raise AgentFailure(
                    "bad_request",
                    f"input {det['name']} is {want} without quantization parameters; float data cannot be fed to it",
                    EXIT_BAD_REQUEST,
                )
            info = np.iinfo(want)
            x = np.clip(np.round(x / scale + zp), info.min, info.max)
        return np.ascontiguousarray(x.astype(want, copy=False))

    def run(self, feeds: Sequence[Any]) -> list[Any]:
        import numpy as np

        if self.cm is not None:
            # CompiledModel: the same contract (host-order inputs in, copies of the outputs back),
            # through its TensorBuffers
            for pos, det, x in zip(self._in_pos, self.inputs, feeds):
                self._in_bufs[pos].write(self._feed(np, det, x))
            self.cm.run_by_index(self._sig, self._in_bufs, self._out_bufs)
            return [self._out_bufs[pos].read(n, dtype).reshape(shape) for pos, n, dtype, shape in self._reads]
        for det, x in zip(self.inputs, feeds):
            self.interp.set_tensor(det["index"], self._feed(np, det, x))
        self.interp.invoke()
        return [self.interp.get_tensor(o["index"]) for o in self.outputs]

    def output_quantization(self, i: int) -> tuple[float | None, int | None]:
        """(scale, zero_point) of output ``i`` when it is an integer tensor, else (None, None)."""
        det = self.outputs[i]
        if det["dtype"] is not None and str(det["dtype"]).find("int") >= 0:
            return self._quant(det)
        return None, None

    def profile(self, feeds: Sequence[Any], runs: int) -> Doc:
        # Checked against ai_edge_litert 2.3.0: nothing in its Python API installs or reads a profiler.
        return no_op_profile(
            f"{self.version}: LiteRT's Python API exposes no per-op profiler (Interpreter has no profiler hook, "
            "its experimental_force_delegate_node_profiling only affects a profiler installed from C++; "
            "CompiledModel has none; profiling_info_pb2 is only the message schema of the C++ benchmark tool's "
            "output); per-op times need benchmark_model --enable_op_profiling=true"
        )
