"""The runner contract: one runtime on the device, and what every runner shares (option checking,
the op-profile answer, package probes that do not import the runtime)."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

from ..protocol import EXIT_BAD_REQUEST, AgentFailure, Doc
from ..stats import median


def no_op_profile(reason: str) -> Doc:
    """The op_profile answer of a runtime that has no per-op profiler here, with the reason."""
    return {"source": None, "runs": 0, "total_us": None, "ops": [], "reason": reason}


def finish_op_profile(source: str, ops: dict[str, Doc], runs_us: Sequence[float]) -> Doc:
    """The op_profile answer from per-node call times (``op["us"]``) and the runs' wall times: totals
    and medians (robust to a disturbed run on a shared device), slowest first."""
    for op in ops.values():
        op["median_us"] = median(op.pop("us"))
    return {
        "source": source,
        "runs": len(runs_us),
        "total_us": float(sum(runs_us)),
        "median_run_us": median(runs_us),
        "ops": sorted(ops.values(), key=lambda o: -o["total_us"]),
        "reason": None,
    }


class Runner:
    """One runtime on the device. A subclass names its runtime (``name``, the request's ``runtime``),
    says how to find it (``probe``), loads a model (``load``) and runs one batch (``run``); the
    agent does the timing, memory, energy and eval bookkeeping around it. Adding a runtime is one
    subclass registered in ``runners.RUNNERS`` (``--probe`` and requests both read that one dict).

    ``Runner(model_path, threads, input_specs=..., output_specs=...)`` loads at once (the host's
    in-process parity checks build runners that way); ``Runner.open(model_path, request)`` is what
    the agent calls with the request JSON (``threads``, ``inputs``, ``outputs``)."""

    name: ClassVar[str] = ""  # the runtime's name in requests, --probe and the report
    log_missing: ClassVar[bool] = True  # --probe logs why the runtime is unavailable (on stderr)
    # Runtime options this runner takes (request "runtime_options"): name -> the allowed values (a
    # tuple), or None for a positive integer. Empty: the runner refuses any.
    OPTIONS: ClassVar[Mapping[str, tuple[Any, ...] | None]] = {}

    def __init__(
        self,
        model_path: str | None = None,
        threads: int = 1,
        input_specs: Sequence[Doc] | None = None,
        output_specs: Sequence[Doc] | None = None,
        runtime_options: Doc | None = None,
    ) -> None:
        self.threads = int(threads)
        self.version: str | None = None
        self.delegate: str | None = None  # the delegate that runs the graph when the runner knows it ("xnnpack")
        self.warnings: list[str] = []  # what the report must say about how this model was run (a delegate fallback)
        self.options: Doc = {}  # the runtime options as applied (what the report and ship/runtime.json carry)
        if model_path is not None:
            self.load(
                model_path,
                {
                    "threads": threads,
                    "inputs": input_specs or [],
                    "outputs": output_specs or [],
                    "runtime_options": runtime_options,
                },
            )

    @classmethod
    def check_options(cls, opts: Mapping[str, Any] | None) -> Doc:
        """The request's runtime options, checked against OPTIONS: an unknown name or value is a
        bad_request naming what this runner takes (a search must never measure a setting the
        runtime silently ignored)."""
        opts = dict(opts or {})
        if opts and not cls.OPTIONS:
            raise AgentFailure(
                "bad_request", f"runtime {cls.name} takes no runtime options (got {sorted(opts)})", EXIT_BAD_REQUEST
            )
        unknown = sorted(set(opts) - set(cls.OPTIONS))
        if unknown:
            raise AgentFailure(
                "bad_request", f"unknown {cls.name} option(s) {unknown}; known: {sorted(cls.OPTIONS)}", EXIT_BAD_REQUEST
            )
        for key, value in opts.items():
            allowed = cls.OPTIONS[key]
            if allowed is None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise AgentFailure(
                        "bad_request",
                        f"{cls.name} option {key} must be a positive integer, got {value!r}",
                        EXIT_BAD_REQUEST,
                    )
            elif value not in allowed:
                raise AgentFailure(
                    "bad_request", f"{cls.name} option {key}={value!r} is not one of {list(allowed)}", EXIT_BAD_REQUEST
                )
        return opts

    @classmethod
    def open(cls, model_path: str, request: Doc) -> Runner:
        cls.check_options(request.get("runtime_options"))
        runner = cls()
        runner.load(model_path, request)
        return runner

    @classmethod
    def probe(cls) -> tuple[str | None, str | None]:
        """(version string, None) when the runtime imports here, else (None, reason)."""
        raise NotImplementedError

    def load(self, model_path: str, request: Doc) -> None:
        """Load ``model_path``; ``request`` gives ``threads``, ``inputs`` and ``outputs`` (host specs).
        Sets ``self.version``; raises AgentFailure (runtime_missing / model_load_failed)."""
        raise NotImplementedError

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """One inference: arrays in the model's input order -> its outputs, in the host's order."""
        raise NotImplementedError

    def batch_dynamic(self) -> bool:
        """Whether the model's batch axis is dynamic (any chunk size may be fed)."""
        return False

    def static_batch(self) -> int | None:
        """The model's fixed batch size (None when the batch axis is dynamic)."""
        return None if self.batch_dynamic() else 1

    def profile(self, feeds: Sequence[Any], runs: int) -> Doc:
        """Per-op times of ``runs`` inferences from the runtime's OWN profiler (one more run first,
        left out): {"source", "runs", "total_us" (the profiled runs' wall time), "ops": [{"node",
        "op_type", "calls", "total_us", "provider"}], "reason"}. Without a profiler: source None and
        the reason (never a figure made up here)."""
        return no_op_profile(f"the {self.name} runner has no per-op profiler")


def dist_version(name: str) -> str | None:
    """An installed distribution's version from its metadata (None when it is not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe_installed(dist: str, missing: str) -> tuple[str | None, str | None]:
    """A runner's probe from package metadata only (importing the runtime can cost seconds): (version, None),
    or (None, why) when it is not installed."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec(dist) is None:
        return None, missing
    try:
        return importlib.metadata.version(dist), None
    except importlib.metadata.PackageNotFoundError as exc:
        return None, f"{dist} has no package metadata: {exc}"
