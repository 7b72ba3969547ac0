"""The one device stage: everything between "the variants are built" and "here are their numbers".

A :class:`DeviceSession` opens the transport (its own, or the caller's), takes the device's lock with
the user's lock options, delivers the eval data and the models by content, opens the measurement
cache, reads the device's facts before and after, and measures one variant at a time:
``measure(name, artifact, settings) -> Measured | MeasureFailure``. A variant the agent could not
run comes back as a typed :class:`MeasureFailure` (the agent's error kind), so a search drops that
candidate and goes on, while a broken link or device still raises. ``deploy`` and ``search`` are
orchestrations over this one class; ``measure_ab`` serves the release gate's A/B re-measurement.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..agent.benchmark_model import run_benchmark_model
from ..agent.browser_transport import BrowserTransport
from ..agent.bundle import BundleDeployer
from ..agent.protocol import AgentRequest, AgentResult, AgentRunFailed, MeasureOptions, build_request, run_request
from ..artifact import Artifact, IOSpec
from ..errors import AgentError, BadInputError, DeviceError, EdgekitError
from ..formats import Format, format_spec, spec_for_runtime
from ..inputs.data import Dataset, eval_bundle
from ..inputs.targets import MeasureDefaults, TargetSpec
from ..measure.cache import open_device_measurements
from ..measure.stats import ABBlocks, latency_stats
from ..measure.sustained import analyze
from ..report.model import VariantResult
from ..transport.base import Transport
from ..transport.local import LocalTransport
from .coordinator import session_place
from .inventory import _attach_lock, get_device, held_lock, open_device_transport
from .lease import session_lease
from .lock import DeviceLock

if TYPE_CHECKING:
    from ..agent.bundle import DeliveryStats
    from ..inputs.stateful import Stream
    from ..metrics.evaluate import EvalPlan
    from ..timeline import Clock

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunSettings:
    """How one variant is measured: the target's measure block with the user's overrides, plus the
    extras (warmup mode, sustained run, energy command), and whether the eval pass runs."""

    measure: MeasureDefaults
    options: MeasureOptions = MeasureOptions()
    energy_sources: tuple[str, ...] = ()
    with_eval: bool = True
    benchmark_binary: str | Path | None = None  # also run TFLite's benchmark_model on .tflite variants
    cached: bool = True  # False: always measure (the A/B blocks of the release gate)
    runtime_options: dict[str, Any] | None = None  # e.g. {"graph_optimization_level": "basic"} (onnxruntime)
    # seconds one agent run may take (None: the request's own, max_seconds + AGENT_TIMEOUT_MARGIN_S); the
    # search's runtime tuning gives each row its share of the remaining budget
    timeout_s: float | None = None

    def but(self, **changes: Any) -> "RunSettings":
        from dataclasses import replace

        return replace(self, **changes)


class Workload(Protocol):
    """What the device runs for a variant, and how its answer becomes the report's row: the one seam between
    kinds of model. Fixed-graph inference over the eval set (:class:`Inference`, the default) and a language
    model's generation and scoring (``edgekit/llm/workload.py``) are two workloads; the session, its delivery,
    its measurement cache and its lock are the same for both."""

    kind: str  # "inference" | "generation": what the report's settings record

    def request(self, session: DeviceSession, name: str, art: Artifact, settings: RunSettings) -> AgentRequest:
        """The agent request that measures ``art`` (its files already delivered)."""
        ...

    def result(self, session: DeviceSession, name: str, art: Artifact, res: AgentResult) -> VariantResult:
        """The agent's answer as the report's row (every statistic and metric computed here, on the host)."""
        ...

    def timeout_s(self, req: AgentRequest) -> float | None:
        """Seconds one agent run of ``req`` may take (None: the request's own)."""
        ...

    def measure_ab(
        self,
        session: DeviceSession,
        a: Artifact,
        b: Artifact,
        settings: RunSettings,
        settings_b: RunSettings,
        blocks: int,
        progress: Progress | None,
    ) -> ABBlocks:
        """The latency of ``a`` and ``b`` taking turns (A B, B A, A B ...), ``blocks`` pairs, never from the
        cache: the one A/B of the release gate and of the search's finals (``report/release.py: judge_ab``
        judges it). Each side runs with its own settings."""
        ...


class Inference:
    """Fixed-graph inference: timed runs of one input, then the eval set through the model; the host scores the
    outputs with the run's metric plan (``session.plan``)."""

    kind = "inference"

    def request(self, session: DeviceSession, name: str, art: Artifact, settings: RunSettings) -> AgentRequest:
        return session.inference_request(name, art, settings)

    def result(self, session: DeviceSession, name: str, art: Artifact, res: AgentResult) -> VariantResult:
        return variant_result(name, art, res, session.plan)

    def timeout_s(self, req: AgentRequest) -> float | None:
        return None

    def measure_ab(
        self,
        session: DeviceSession,
        a: Artifact,
        b: Artifact,
        settings: RunSettings,
        settings_b: RunSettings,
        blocks: int,
        progress: Progress | None,
    ) -> ABBlocks:
        return ab_in_one_process(session, a, b, settings, settings_b, blocks)


@dataclass
class Measured:
    """One variant's numbers: the report's VariantResult and the eval outputs the host scores."""

    result: VariantResult
    artifact: Artifact
    outputs: list[Any] | None
    doc: dict[str, Any]  # the agent's document (warnings, device facts)
    score_warnings: list[str] = field(default_factory=list)  # from its paired statistics, computed once

    @property
    def name(self) -> str:
        return self.result.name


@dataclass(frozen=True)
class MeasureFailure:
    """The agent ran but could not measure this variant; ``kind`` is the agent's error kind."""

    variant: str
    kind: str
    message: str
    hint: str | None = None

    def error(self, measured: Sequence[str] = (), pending: Sequence[str] = ()) -> DeviceError:
        msg = self.message
        if measured or pending:
            msg += (
                f" (measured before the failure: {', '.join(measured) or 'none'}; not measured: "
                f"{', '.join(pending) or 'none'}; no report written)"
            )
        return AgentRunFailed(msg, kind=self.kind, variant=self.variant, hint=self.hint)


LOCAL_LOCK = "local"  # the lock name of this host as a device (the local target)


def open_transport(
    target: TargetSpec, device: str | None, *, lock_wait: bool = True, lock_timeout: float | None = None
) -> Transport:
    if device is None:
        if target.transport in ("local", "browser"):
            # this host's CPU is the device (the browser's too): two deploys measuring on it at once inflate
            # each other's figures
            lock = DeviceLock(LOCAL_LOCK)
            lock.acquire(wait=lock_wait, timeout=lock_timeout)
            t: Transport
            try:
                if target.transport == "browser":
                    t = BrowserTransport(profile=target.browser)
                else:
                    t = LocalTransport()
            except BaseException:
                lock.release()
                raise
            _attach_lock(t, lock)
            return t
        raise BadInputError(
            f"target '{target.name}' is reached over {target.transport}: name the device",
            hint="pass --device NAME (see `edgekit devices list`), or use --target local",
        )

    return open_device_transport(device, target, wait=lock_wait, lock_timeout=lock_timeout)


def provision_hint(target: TargetSpec, device: str | None, runtime: str) -> str:
    """The command that installs ``runtime`` on the device (the agent only knows pip's name for it)."""
    where = device or target.name
    wheels = target.wheels
    if runtime not in target.runtimes:
        return f"target {target.name} does not list the {runtime} runtime: measure a variant it runs there"
    if wheels is not None and runtime in wheels.runtime_packages:
        return f"install it with `edgekit devices provision {where} --runtime {runtime}`"
    if wheels is not None:
        return f"install the target's runtimes with `edgekit devices provision {where}`"

    row = spec_for_runtime(runtime)
    if target.transport == "local" and row is not None and row.extra:
        return f"install it on this host: pip install 'edgekit[{row.extra}]'"
    if target.transport == "browser":  # the page's runtimes come from npm at setup
        return "install the page's runtimes: bash .ci/install.sh (npm ci in device_agents/browser)"
    return f"install {runtime} on the device (`edgekit doctor` names its package)"


def emulation_of(device: str | None) -> str | None:
    """How the device is emulated (an arm64 twin under qemu, from its inventory entry); None = real."""
    if device is None:
        return None

    try:
        entry = get_device(device)
    except BadInputError:
        return None
    return (entry.notes or "CPU emulation") if entry.emulated else None


class DeviceSession:
    def __init__(
        self,
        target: TargetSpec,
        device: str | None,
        *,
        source_io: IOSpec | None,
        plan: EvalPlan | None,
        transport: Transport | None = None,
        lock_wait: bool = True,
        lock_timeout: float | None = None,
        remeasure: bool = False,
        progress: Progress | None = None,
        clock: Clock | None = None,
    ):
        self.target, self.device = target, device
        # edgekit.timeline.Clock: the lock wait is its own span, outside the time budget
        self.clock = clock
        self.lock_wait_s = 0.0
        self.source_io, self.plan = source_io, plan
        self._given = transport
        self._lock = (lock_wait, lock_timeout)
        self.remeasure = remeasure
        self.progress = progress or (lambda _m: None)
        self.transport: Transport | None = None
        self.facts_before: dict[str, Any] | None = None
        self.facts_after: dict[str, Any] | None = None
        self.emulation = emulation_of(device) or (
            target.browser.describe() if target.browser is not None and target.browser.emulated else None
        )
        self._remotes: dict[Path, str] = {}
        self._eval_bundle: Path | list[dict[str, Path]] | None = None
        self._eval_keys: tuple[str, ...] = ()
        self._eval_buckets: list[int] | None = None
        self._stream: Stream | None = None
        self.workload: Workload = Inference()

    # --- lifetime --------------------------------------------------------------------------------
    def __enter__(self) -> "DeviceSession":
        import time

        opened = time.perf_counter()
        if self._given is None:
            self.progress(f"waiting for the device's lock ({self.device or self.target.name})")
        t = self._given or open_transport(self.target, self.device, lock_wait=self._lock[0], lock_timeout=self._lock[1])
        self.transport = t
        try:
            lock = held_lock(t)
            waited = lock.waited_s if lock is not None else 0.0
            if self._given is None and self.device is not None:  # the device-side lease (other hosts)
                # with EDGEKIT_COORDINATOR: the device's labgrid place first (None without it)
                self.place = session_place(
                    self.device, wait=self._lock[0], timeout=self._lock[1], progress=self.progress
                )
                self.lease = session_lease(t, self.device, wait=self._lock[0], timeout=self._lock[1])
                waited += getattr(self.place, "waited_s", 0.0) + getattr(self.lease, "waited_s", 0.0)
            self.lock_wait_s = round(waited, 3)
            if self.clock is not None:  # the wait is excluded from the budget
                self.clock.add_span("lock_wait", opened, opened + waited, excluded=True)
            self.progress(f"deploying the bundle to {t.describe()}")
            self.deployer = BundleDeployer(t)
            # transports that know the device beyond the agent (adb: getprop, battery) describe it before and after
            self.facts_before = t.device_facts() if hasattr(t, "device_facts") else None

            self.measurements = open_device_measurements(
                self.deployer, device_name=self.device, remeasure=self.remeasure
            )
            if self.clock is not None:  # connecting, the agent's bundle and the device's probe
                self.clock.add_span("connect", opened + self.lock_wait_s, time.perf_counter())
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is None and self.facts_before is not None:
                self.facts_after = self._t.device_facts()  # type: ignore[attr-defined]  # set only where it has them
        finally:
            self._close()

    def _close(self) -> None:
        lease, self.lease = getattr(self, "lease", None), None
        if lease is not None:
            self.lease_lost = lease.lost  # another host took the device over while we measured: said in the report
            lease.release()  # before the transport closes; never raises
        place, self.place = getattr(self, "place", None), None
        if place is not None:  # the labgrid place: after the lease, before the host lock; never raises
            self.lease_lost = getattr(self, "lease_lost", None) or place.release()
        if self._given is None and self.transport is not None:
            self.transport.close()  # releases the device's lock

    @property
    def _t(self) -> Transport:
        """The open transport (inside ``with DeviceSession(...)``)."""
        if self.transport is None:
            raise RuntimeError("the device session is not open: use it inside `with DeviceSession(...)`")
        return self.transport

    # --- delivery --------------------------------------------------------------------------------
    def use_eval(self, ds: Dataset, art_dir: Path) -> None:
        """Deliver the eval set (by content) that every measurement with ``with_eval`` reads."""

        self._eval_bundle = eval_bundle(ds, art_dir)
        self._eval_keys = ds.x_keys
        self._eval_buckets = ds.shards_per_bucket  # or None: one shape
        self._stream = ds.stream  # constant/state inputs (edgekit/inputs/stateful.py): sent with every request
        self._deliver(self._eval_files(), kind="eval")

    def use_workload(self, workload: Workload) -> None:
        """What every later :meth:`measure` runs (default: :class:`Inference` over the eval set)."""
        self.workload = workload

    def deliver(self, artifacts: Iterable[Artifact]) -> None:
        self._deliver([f for a in artifacts for f in a.files])  # every file of each model

    def deliver_files(self, files: list[Path], kind: str = "model") -> dict[Path, str]:
        """Other files a request names (a language model's scoring windows): delivered by content like the
        models; returns each file's path on the device."""
        self._deliver(list(files), kind=kind)
        return {Path(f): self._remotes[Path(f)] for f in files}

    def results_path(self, name: str, art: Artifact) -> str:
        """Where the agent writes a variant's outputs on the device (one file per variant and content)."""
        return self._t.remote_path(f"results/{name}-{art.sha256[:12]}.npz")

    def remote(self, path: Path) -> str:
        """Where a delivered file is on the device."""
        return self._remotes[Path(path)]

    def _deliver(self, files: list[Path], kind: str = "model") -> None:
        todo = [f for f in dict.fromkeys(files) if f not in self._remotes]
        if todo:
            self._remotes.update(self.deployer.deliver(todo, kind=kind))

    def _eval_files(self) -> list[Path]:
        b = self._eval_bundle
        return [] if b is None else ([b] if isinstance(b, Path) else [f for sh in b for f in sh.values()])

    def _eval_remote(self) -> str | list[dict[str, str]] | None:
        b = self._eval_bundle
        if b is None:
            return None
        if isinstance(b, Path):
            return self._remotes[b]
        return [{k: self._remotes[f] for k, f in sh.items()} for sh in b]

    @property
    def delivery(self) -> DeliveryStats:
        return self.deployer.stats

    # --- measuring -------------------------------------------------------------------------------
    def request(self, name: str, art: Artifact, settings: RunSettings) -> AgentRequest:
        """The session's workload's request for ``art``, its files delivered first."""
        self.deliver([art])
        return self.workload.request(self, name, art, settings)

    def inference_request(self, name: str, art: Artifact, settings: RunSettings) -> AgentRequest:
        """Fixed-graph inference: the timed runs, then the eval set delivered by :meth:`use_eval`."""
        if self.source_io is None:
            raise TypeError(
                "fixed-graph inference builds its request from the source's io: DeviceSession(source_io=...)"
            )
        with_eval = settings.with_eval and self._eval_bundle is not None
        return build_request(
            variant=name,
            artifact=art,
            model_remote=[self._remotes[f] for f in art.files],
            source_io=self.source_io,
            measure=settings.measure,
            eval_remote=self._eval_remote() if with_eval else None,
            x_keys=self._eval_keys,
            outputs_remote=self.results_path(name, art) if with_eval else None,
            energy_sources=settings.energy_sources or tuple(self.target.energy_sources),
            options=settings.options,
            runtime_options=settings.runtime_options,
            stream=self._stream,
            eval_buckets=self._eval_buckets if with_eval else None,
        )

    def run(self, req: AgentRequest, settings: RunSettings) -> AgentResult | MeasureFailure:
        """One agent run (or its cached result). A variant's own failure is returned; a broken
        transport or device raises."""
        try:
            if settings.cached:
                return self.measurements.measure(
                    req, lambda: run_request(self.deployer, req, timeout=settings.timeout_s)
                )
            return run_request(self.deployer, req, timeout=settings.timeout_s)
        except AgentRunFailed as exc:
            if not exc.variant_fault:
                raise
            hint = provision_hint(self.target, self.device, req.runtime) if exc.kind == "runtime_missing" else exc.hint
            return MeasureFailure(variant=req.variant, kind=exc.kind, message=exc.message, hint=hint)

    def measure(self, name: str, art: Artifact, settings: RunSettings) -> Measured | MeasureFailure:
        """One variant measured by the session's workload: its request, the agent's run (or the measurement
        cache's copy), and its answer read as the report's row."""
        req = self.request(name, art, settings)
        if settings.timeout_s is None:
            settings = settings.but(timeout_s=self.workload.timeout_s(req))
        res = self.run(req, settings)
        if isinstance(res, MeasureFailure):
            return res
        result = self.workload.result(self, name, art, res)
        result.measurement = self.measurements.info.get(name, {})
        if settings.benchmark_binary is not None and art.format == Format.TFLITE:
            self.progress(f"measuring {name} with benchmark_model")
            result.benchmark_model = self._benchmark_model(art, settings)
        return Measured(result=result, artifact=art, outputs=res.outputs, doc=res.doc)

    def lacking_runtime(self, art: Artifact) -> str | None:
        """Why the device cannot run ``art``: its runtime is not among those the device's agent has (its
        ``--probe``), with the command that installs it; None when it has it or the probe cannot say."""

        runtime = format_spec(art.format).runtime
        try:
            have = self.measurements.probe_doc().get("runtimes")
        except AgentError:  # an agent that cannot probe fails the measurement itself, with its own words;
            return None  # a device that went away (TransportError) fails here, as it would at delivery
        if not runtime or not isinstance(have, dict) or runtime in have:
            return None
        return f"the device has no {runtime} runtime (it has {', '.join(sorted(have)) or 'none'}): " + provision_hint(
            self.target, self.device, runtime
        )

    def measure_or_drop(self, name: str, art: Artifact, settings: RunSettings) -> Measured | MeasureFailure:
        """:meth:`measure`, where a failed run on a device that still answers is this variant's
        failure: a timeout, an agent killed by a signal, an answer that is not JSON or any other
        agent failure comes back as a MeasureFailure (kind ``timeout``, ``agent_died`` or the agent's
        kind) when :meth:`responsive` says the device answers; a device that no longer answers still
        raises the original error (exit 3). For settings a search may drop (runtime tuning); deploy's
        recipe path keeps :meth:`measure`, which raises."""
        try:
            return self.measure(name, art, settings)
        except DeviceError as exc:
            if not self.responsive():
                raise
            return MeasureFailure(
                variant=name, kind=_failure_kind(exc), message=f"{exc.message}; the device still answers", hint=exc.hint
            )

    def responsive(self, timeout: float = 30) -> bool:
        """Does the device still answer? One cheap agent call (``--version``) through the transport;
        False on a transport error, a timeout or an answer that is not the agent's. Never raises."""
        t, deployer = self.transport, getattr(self, "deployer", None)
        if t is None or deployer is None:
            return False
        try:
            res = t.run([t.python, deployer.agent, "--version"], timeout=timeout)
            doc = json.loads(res.stdout)
        except (EdgekitError, OSError, ValueError):
            return False
        return res.returncode == 0 and isinstance(doc, dict) and bool(doc.get("ok"))

    def measure_ab(
        self,
        a: Artifact,
        b: Artifact,
        settings: RunSettings,
        blocks: int,
        *,
        settings_b: RunSettings | None = None,
        progress: Progress | None = None,
    ) -> ABBlocks:
        """Latency of ``a`` and ``b`` in alternating turns (A B, B A, A B ...), never from the cache, so slow
        drift of a shared device (load, clocks, heat) hits both sides alike: the workload's A/B (a fixed graph's
        blocks inside one agent process, a generator's decode-only agent runs). ``settings_b``: b's own settings
        (threads, runtime options; default ``settings``)."""
        self.deliver([a, b])
        return self.workload.measure_ab(self, a, b, settings, settings_b or settings, blocks, progress)

    def profile_doc(self, name: str, art: Artifact, settings: RunSettings, runs: int = 20) -> dict[str, Any] | None:
        """The agent's per-op profile of ``art`` (a separate short run, so profiling never touches
        the timed figures): its ``op_profile`` document, or None when the agent returned none."""
        m = settings.measure.model_copy(update={"runs": runs, "min_seconds": 0.0, "max_runs": runs})
        s = settings.but(measure=m, with_eval=False, cached=False)
        req = self.request(f"{name}-profile", art, s).model_copy(update={"profile": {"runs": runs}})
        res = self.run(req, s)
        if isinstance(res, MeasureFailure):
            return {"source": None, "reason": f"the profiling run failed ({res.kind}): {res.message}", "ops": []}
        profile = res.doc.get("op_profile")
        return profile if isinstance(profile, dict) else None

    def _benchmark_model(self, art: Artifact, settings: RunSettings) -> dict[str, Any]:
        m = settings.measure
        binary = settings.benchmark_binary
        if binary is None:
            raise ValueError("benchmark_model needs settings.benchmark_binary (a binary, or 'device')")
        exe = None if str(binary) == "device" else Path(binary)
        r = run_benchmark_model(
            self._t,
            self._remotes[Path(art.path)],
            binary=exe,
            threads=m.threads,
            warmup=m.warmup,
            runs=m.runs,
            min_seconds=m.min_seconds,
        )
        return r.to_report()

    # --- facts -----------------------------------------------------------------------------------
    def device_info(self, first_doc: dict[str, Any], results: list[VariantResult]) -> dict[str, Any]:
        return platform_facts(self.facts_before, self.facts_after) | device_info(
            first_doc, self._t, self.device, self.target, results, self.emulation
        )

    def warnings(self) -> list[str]:
        out = (
            [f"device {self.device}: {self.lease_lost}; figures measured after that may overlap another host's run"]
            if getattr(self, "lease_lost", None)
            else []
        )
        reused = self.measurements.warning()
        if reused:
            out.append(reused)
        if self.emulation:
            out.append(
                f"device {self.device} is emulated ({self.emulation}): latency and memory figures are NOT "
                "representative of real hardware; accuracy, parity and the deploy path are real"
            )
        return out


def _failure_kind(exc: DeviceError) -> str:
    """A MeasureFailure's kind for a device error: the agent's own kind, ``timeout`` when the run
    outlived its limit (every transport says "timed out"), else ``agent_died`` (killed by a signal,
    no JSON document, a dropped channel)."""
    if isinstance(exc, AgentRunFailed):
        return exc.kind
    if isinstance(exc.__cause__, (TimeoutError, subprocess.TimeoutExpired)) or "timed out" in exc.message:
        return "timeout"
    return "agent_died"


def variant_result(name: str, art: Artifact, res: AgentResult, plan: EvalPlan | None) -> VariantResult:
    """The agent's document, parsed once, as the report's VariantResult (statistics, parity and
    the metric computed here, on the host, with the run's metric plan; a timing-only run needs none)."""
    doc = res.parsed
    lat = doc.latency_ms
    stats = latency_stats(lat.raw)
    parity = parity_outputs = accuracy = None
    if res.outputs is not None:
        if plan is None:
            raise TypeError("the eval outputs are read with the run's metric plan: DeviceSession(plan=...)")
        parity_outputs = plan.parity(res.outputs)
        parity = next(iter(parity_outputs.values()), None)
        accuracy = plan.accuracy_dict(plan.score(res.outputs))

    # validated from plain dicts (the agent's sections, the artifact's lineage) into the report's types
    return VariantResult.model_validate(
        dict(
            name=name,
            format=art.format.value,
            precision=art.precision,
            runtime=doc.runtime.model_dump(),
            size_bytes=art.size_bytes,
            sha256=art.sha256,
            artifact_path=str(art.path),
            lineage=art.lineage_dicts(),
            load_ms=doc.load_ms,
            latency_ms={
                "warmup": lat.warmup,
                "runs": lat.runs,
                "raw": lat.raw,
                **stats.to_dict(),
                **doc.warmup_fields(),
                **weighted_latency(lat.model_extra or {}),
                **doc.timer_fields(),
                **({"raw_decimation": lat.raw_decimation} if (lat.raw_decimation or 1) > 1 else {}),
            },
            peak_memory_mb=doc.memory.get("peak_rss_mb"),
            memory=doc.memory,
            energy_mj_per_inference=doc.energy.get("energy_mj_per_inference"),
            energy_source=doc.energy.get("source"),
            energy_reason=doc.energy.get("reason"),
            energy=doc.energy,
            sustained=analyze(doc.sustained),
            accuracy=accuracy,
            parity=parity,
            parity_outputs=parity_outputs if parity_outputs and len(parity_outputs) > 1 else None,
            device_state=doc.device_state,
        )
    )


def weighted_latency(extra: dict[str, Any]) -> dict[str, Any]:
    """An eval set at several sample shapes: the agent timed one chunk per shape bucket (bucket 0's are
    the main timed runs, which the statistics above describe); the sample-weighted mean and p50 say
    what a sample of the set costs on average."""
    buckets = extra.get("buckets")
    if not buckets:
        return {}
    n = sum(b["samples"] for b in buckets)
    return {
        "buckets": buckets,
        "weighted_mean": sum(b["mean"] * b["samples"] for b in buckets) / n,
        "weighted_p50": sum(b["p50"] * b["samples"] for b in buckets) / n,
    }


def platform_facts(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """An Android device's facts (model, SoC, version, clocks, battery) from the adb transport."""
    if before is None:
        return {}
    return {
        "android": before,
        "battery_temperature_c": {
            "before": before.get("battery_temperature_c"),
            "after": (after or {}).get("battery_temperature_c"),
        },
    }


def device_info(
    doc: dict[str, Any],
    t: Transport,
    device: str | None,
    spec: TargetSpec,
    vresults: Sequence[VariantResult],
    emulation: str | None = None,
) -> dict[str, Any]:
    facts = dict(doc.get("device") or {})
    states = [v.device_state for v in vresults if v.device_state]
    before = states[0].get("before", {}) if states else {}
    after = states[-1].get("after", {}) if states else {}
    facts.update(
        {
            "name": device or ("localhost" if t.kind == "local" else t.describe()),
            "transport": t.kind,
            "governor": before.get("governor"),
            "frequency_mhz": before.get("frequency_mhz"),
            "temperature_c": {"before": before.get("temperature_c"), "after": after.get("temperature_c")},
            "loadavg_before": before.get("loadavg"),
            "target_arch": spec.arch,
        }
    )
    if emulation:  # the report's readers (and the gate's users) must know the timings are not the board's
        facts.update({"emulated": True, "emulation": emulation, "latency_representative": False})
    return facts


def ab_in_one_process(
    session: DeviceSession, a: Artifact, b: Artifact, settings: RunSettings, settings_b: RunSettings, blocks: int
) -> ABBlocks:
    """A fixed graph's A/B: blocks of ``a`` and ``b`` alternating inside one agent process. Blocks are short (a
    tenth of the target's min_seconds, >= 50 ms). ``b`` may be another format on another runtime (the search's
    finals): the request then carries b's runtime and interface too."""
    s = settings.but(with_eval=False, cached=False)
    block_s = max(0.05, min(0.5, settings.measure.min_seconds / 10))
    req = session.request("ab", a, s)
    req_b = session.request("ab-b", b, s)
    own: dict[str, Any] = (
        {"runtime": req_b.runtime, "format": req_b.format, "inputs": req_b.inputs, "outputs": req_b.outputs}
        if (req_b.runtime, req_b.format) != (req.runtime, req.format)
        else {}
    )
    req = req.model_copy(
        update={
            "ab": {
                **own,
                "model": session.remote(b.path),
                "model_sha256": b.sha256,
                "blocks": blocks,
                "companions": {f.suffix: session.remote(f) for f in b.files[1:]} or None,
                "runtime_options": {**b.runtime_options, **(settings_b.runtime_options or {})} or None,
                "block_seconds": block_s,
                "min_runs": 3,
                "max_runs": 500,
            }
        }
    )
    res = session.run(req, s)
    if isinstance(res, MeasureFailure):
        raise res.error()
    doc = res.doc.get("ab") or {}
    return ABBlocks(
        a=doc.get("a") or [],
        b=doc.get("b") or [],
        order=list(doc.get("order") or ""),
        warnings=list(res.doc.get("warnings") or []),
    )
