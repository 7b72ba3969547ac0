"""Report schema (see DESIGN.md, "Report contract").

``schema_version`` is MAJOR.MINOR: a report with the same MAJOR loads (unknown newer fields are
kept); another MAJOR is refused with a clear message.

Every section is a typed model (``device``, ``search``, ``compared_with``, ``comparison``, each
variant's ``lineage``); all of them keep unknown fields, so a newer minor version's additions survive
a load and a write. This module imports no view (the views import it, never the reverse): the
functions behind ``Report.diff`` and ``Report.write`` are handed over by ``diff.py`` and ``write.py``
(:func:`provides`), which the package's ``__init__`` imports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import BadInputError, GateFailed

# 1.1: energy/sustained/measurement/search/comparison; 1.2: task metrics, per-output parity;
# 1.3: typed sections (device, search, compared_with, comparison, lineage steps) written with every declared
#      field (null when unknown), compared_with.method/method_text/method_detail, Check.ratio_ci95;
# 1.4: language models: model.task, VariantResult.generation and .quality
SCHEMA_VERSION = "1.4"


class _Open(BaseModel):
    # Reports written by newer edgekit versions may carry fields this one does not know: keep them.
    # validate_assignment: a report is assembled in steps (``report.search = {...}``, ``report.comparison =
    # diff.model_dump()``, ``variant.lineage = [...]``); an assigned dict becomes the typed section too.
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    # --- transitional mapping access ---------------------------------------------------------------
    # Sections were plain dicts before 1.3 and some callers still read them as such
    # (``report.device.get("name")``, ``report.search["candidates"]``). New code reads attributes.
    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get`` on a section: a declared field or a kept extra; ``default`` when absent or None."""
        if key in type(self).model_fields:
            value = getattr(self, key)
        else:
            value = (self.__pydantic_extra__ or {}).get(key)
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        if key in type(self).model_fields:
            return getattr(self, key)
        extra = self.__pydantic_extra__ or {}
        if key in extra:
            return extra[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def keys(self) -> list[str]:
        """The declared fields and kept extras (so ``{**section}`` still works)."""
        return [*type(self).model_fields, *(self.__pydantic_extra__ or {})]


class RuntimeInfo(_Open):
    name: str  # the agent's runner: onnxruntime, litert, executorch, openvino, ncnn, llama.cpp, coreml, a page runtime
    version: str | None = None  # the runtime's version on the device, as the agent read it
    threads: int | None = None  # the threads it ran with
    delegate: str | None = None  # the delegate or execution provider, where the runtime has one
    options: dict[str, Any] | None = None  # runtime options applied (e.g. onnxruntime graph_optimization_level)

    def label(self, *, version: bool = False, threads: str = " x{}") -> str:
        """``onnxruntime 1.32.0 x2`` for the tables; the threads only where the runtime ran with a count (the
        float reference computed on the host and a microcontroller's interpreter have none)."""
        head = f"{self.name} {self.version or ''}".rstrip() if version else self.name
        return head + (threads.format(self.threads) if self.threads is not None else "")


class LatencyMs(_Open):
    warmup: int  # untimed runs before the timed ones
    runs: int  # timed runs
    raw: list[float] | None = None  # every timed run, ms, in order
    raw_path: str | None = None  # a file (.npy or JSON) holding the raw timings when they are not inline
    mean: float  # ms
    std: float  # sample standard deviation, ms
    min: float  # ms
    max: float  # ms
    p50: float  # the median, ms: what speed-ups and the search compare
    p90: float  # ms
    p99: float  # ms
    ci95: list[float]  # 95% CI of the median by bootstrap, ms
    cov: float  # std / mean
    outliers: int  # runs outside 1.5 IQR of the quartiles
    stable: bool  # robust_cov <= 0.10 (measure/stats.STABLE_COV)
    robust_cov: float | None = None  # 1.4826*MAD/median; what `stable` is judged on (absent in 1.0 reports)


class Accuracy(_Open):
    """The task metric on the eval set (top1 in %, miou in %, map50 in %, mse, psnr in dB...)."""

    metric: str  # top1, miou, map50, mse, psnr, perplexity...
    value: float  # in `units`
    n: int  # samples (or scored positions) the value is over
    direction: str = "higher"  # higher | lower is better
    units: str = "%"  # the metric's units: % (top1, miou, map50...), dB (psnr, snr), "" (mse, perplexity)
    against: str = "labels"  # labels | reference (the float model's own outputs)
    outputs: list[str] | None = None  # the outputs the metric read


class Parity(_Open):
    reference: str  # what the device's outputs were compared with (the float model's outputs on the host)
    max_abs_err: float  # over every element of the output (inf where the device gave NaN/inf and the float did not)
    mean_abs_err: float  # mean |device - reference| over every element of the output (inf as for max_abs_err)
    cosine: float  # cosine similarity of the whole output, flattened (0 when non-finite values appeared)
    top1_agreement: float | None = None  # share of argmaxes along the class axis that agree (class-like outputs)
    n: int  # samples compared (the output's leading dimension)


class HopParity(_Open):
    """A conversion hop's parity as its lineage step records it (``convert/parity.py: ParityResult``);
    every figure optional, so a hop that measured less still reads."""

    reference: str | None = None
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    n: int | None = None
    exact_agreement: float | None = None  # integer/bool outputs: fraction of elements equal
    # top-1 agreement held to the bar (a model's only output, or a class distribution); else reported only
    top1_held: bool | None = None


class LineageStep(_Open):
    """One step of a variant's lineage as the report keeps it: ``edgekit.artifact.LineageStep`` dumped
    (that one is frozen and closed; this one keeps fields a newer edgekit adds). ``metrics`` stays
    free-form: each pass and hop records its own (a convert hop: ``parity``, ``parity_violations``,
    ``route``...)."""

    kind: str  # source | convert | pass
    name: str  # e.g. "torch->onnx", "quantize"
    # the step's settings: a pass's validated config (defaults filled in), a hop's options (opset, converter...),
    # a source's path
    config: dict[str, Any] = Field(default_factory=dict)
    # what the step measured: a hop's parity and parity_violations, a pass's own figures, a pass-cache hit
    # (cache: hit, key, original_seconds)
    metrics: dict[str, Any] = Field(default_factory=dict)
    input_sha256: str | None = None  # the file the step started from (Artifact.derive); None: none (a source step)
    # meant for the step's output file's hash, but no edgekit code sets it (the artifact's own lineage step has no
    # such field), so it is null; the variant's sha256 is the last step's output
    output_sha256: str | None = None
    # the host's wall seconds for the step (on a pass-cache hit: the reuse; metrics.cache.original_seconds the build)
    seconds: float | None = None

    @property
    def parity(self) -> HopParity | None:
        """The hop's parity against the reference (first output), when it measured one."""
        raw = self.metrics.get("parity")
        if not isinstance(raw, dict):
            return None
        try:
            return HopParity.model_validate(raw)
        except ValidationError:
            return None

    @property
    def parity_violations(self) -> list[str] | None:
        """The tolerance violations of a convert hop ([] = within tolerance); None when not judged."""
        v = self.metrics.get("parity_violations")
        return None if v is None else [str(x) for x in v]

    def config_key(self) -> str:
        """The step's config as a stable string (one hop = name + input + config)."""
        return repr(sorted(self.config.items()))


# --- per-op profiles (computed by edgekit/devices/profile.py) ---------------------------------------------
class OpTime(_Open):
    """One executed node: ``total_ms`` over every profiled run, ``mean_ms`` per inference, ``ms``
    per inference from its median call (robust to one disturbed run; what views and diffs use),
    ``share`` of the profiled runs' wall time. ``module``: the PyTorch module it came from ("" = the model's
    own forward, None = not traceable, e.g. a layout transform onnxruntime inserted)."""

    node: str  # the node as the runtime's profiler names it (onnxruntime node, OpenVINO layer, ExecuTorch event)
    op_type: str | None = None  # its op type as the profiler reports it (e.g. Conv, QLinearConv, Convolution)
    module: str | None = None  # the PyTorch module path it was traced to ("" = the model's forward, None = not traced)
    module_class: str | None = None  # that module's class name (e.g. Conv2d), where the exporter recorded it
    # what ran it: onnxruntime's execution provider, OpenVINO's kernel (exec type), ExecuTorch's delegate | portable
    provider: str | None = None
    calls: int = 0  # times the node ran over the profiled runs
    total_ms: float = 0.0  # its kernel time summed over every profiled run, ms
    mean_ms: float = 0.0  # total_ms / runs: per inference, ms
    ms: float = 0.0  # per inference from its median call (median x calls / runs), ms
    share: float | None = None  # total_ms / the profiled runs' wall time (OpProfile.total_ms); None: that is unknown


class OpTypeTime(_Open):
    op_type: str  # the op type the row sums (OpTime.op_type; "?" for nodes the profiler gave none)
    nodes: int  # profiled nodes of this type
    calls: int  # their calls, summed over the profiled runs
    mean_ms: float  # their summed kernel time / runs: per inference, ms
    ms: float  # per inference, from each node's median call
    share: float | None = None  # their summed kernel time / the profiled runs' wall time; None when that is unknown


class OpProfile(_Open):
    """A variant's per-op profile, or ``source`` None with the ``reason`` (no figures then)."""

    source: str | None = None  # the profiler: onnxruntime, executorch or openvino; None: no profile
    reason: str | None = None  # why there is no profile (e.g. the runtime has no per-op profiler); None when there is
    runs: int = 0  # profiled runs (one more ran first and is left out); 0 without a profile
    total_ms: float | None = None  # wall time of the profiled runs (the runtime's own run events)
    mean_run_ms: float | None = None  # per inference, under the profiler
    median_run_ms: float | None = None  # the median profiled run's wall time, ms (what run_ms and diffs use)
    ops: list[OpTime] = Field(default_factory=list)  # slowest first
    by_op_type: list[OpTypeTime] = Field(default_factory=list)  # slowest first
    mapping: str | None = None  # how nodes were traced to modules (or why they were not)
    mapped_nodes: int = 0  # nodes traced to a PyTorch module (module not None)
    mapped_share: float | None = None  # the share of op time traced to a module

    @property
    def available(self) -> bool:
        return self.source is not None

    @property
    def run_ms(self) -> float:
        """One inference under the profiler: the median run (the mean for an older agent)."""
        return self.median_run_ms if self.median_run_ms is not None else (self.mean_run_ms or 0.0)

    def top(self, n: int = 10) -> list[OpTime]:
        return self.ops[:n]

    def op_type_count(self, op_type: str) -> int:
        return next((t.nodes for t in self.by_op_type if t.op_type == op_type), 0)


class OpTypeDelta(_Open):
    op_type: str  # the op type (OpTypeTime.op_type) of either profile
    base_nodes: int  # its nodes in the base variant's profile (0: none there)
    other_nodes: int  # its nodes in the other variant's profile (0: none there)
    base_ms: float  # per inference
    other_ms: float  # per inference, ms, in the other variant's profile
    delta_ms: float  # other - base (> 0: the other variant spends more here)


class ProfileDiff(_Open):
    base: str  # the variant compared against: the report's baseline
    other: str  # the profiled variant compared with it
    base_source: str | None = None  # the base profile's profiler (OpProfile.source); None: it has no profile
    other_source: str | None = None  # the other profile's profiler; None: it has no profile
    # False: the two profiles come from different profilers (compared by op type only); True also when one is missing
    same_runtime: bool = True
    delta_ms: float | None = None  # per inference under the profiler, other - base
    rows: list[OpTypeDelta] = Field(default_factory=list)  # largest |delta| first
    # one sentence: how much slower (faster) other is under the profiler, the op types that account for it and
    # the compute a quantized model leaves in fp32; or why there is no diff (a profile missing)
    summary: str


class Generation(_Open):
    """A language model's generation figures on the device (edgekit/llm/request.py computes them from the
    agent's raw timings)."""

    context: int = Field(description="the positions the file takes (its KV cache's length)")
    ttft_cold_ms: float | None = Field(None, description="the first prefill right after loading, shortest prompt")
    ttft_ms: float | None = Field(None, description="time to first token, warm, at the shortest prompt (median)")
    prefill: list[dict[str, Any]] = Field(
        default_factory=list, description="per prompt length: tokens, ttft_ms (median), tokens_per_s, raw ms"
    )
    decode_tokens_per_s: float | None = Field(None, description="1000 / mean ms a token, decoding from an empty cache")
    decode_tokens_per_s_ci95: list[float] | None = Field(None, description="bootstrap 95% CI over the timed tokens")
    inter_token_ms: dict[str, Any] = Field(default_factory=dict, description="p50, p95, mean, n of the decode steps")
    decode_filled: dict[str, Any] = Field(
        default_factory=dict, description="decode after a prompt that fills the cache near the context"
    )
    peak_rss_mb: float | None = Field(
        None,
        description="the agent process's peak RSS on the device over the run, MB "
        "(VmHWM, else ru_maxrss); None when unreadable",
    )
    kv_cache_mb: float | None = Field(None, description="the KV cache at kv_cache_tokens positions")
    kv_cache_source: str | None = Field(None, description="runtime (the arrays it holds) or config (computed)")
    kv_cache_tokens: int | None = Field(
        None,
        description="positions the cache held when read: the filled prompt's "
        "plus the decoded tokens (its fullest in the run)",
    )
    energy_mj_per_token: float | None = Field(
        None, description="mJ a generated token, from the agent's energy record; None when no energy source read"
    )


class LMQuality(_Open):
    """A language model's quality from the device's own log-probabilities on the eval text, against the
    float model on the host (edgekit/llm/quality.py)."""

    positions: int  # scored positions: windows x (window tokens - 1), each predicting the next token
    windows: int  # teacher-forced windows of the eval text, each scored from an empty cache
    top_k: int = Field(
        description="the most tokens a position at which the device's log-probs came back (the float model's top-K)"
    )
    top_k_mean: float | None = Field(None, description="tokens a position on average (sized to the coverage target)")
    coverage_target: float | None = Field(
        None, description="the float mass each position's tokens were sized to hold (None: a fixed --top-k)"
    )
    top_k_capped_at: int | None = Field(
        None,
        description="the K the flattest positions were cut to, to keep the transfer inside its cap (None: not cut)",
    )
    scored_ids: int | None = Field(None, description="token log-probabilities the scoring moved a variant")
    scoring_bytes: int | None = Field(None, description="bytes the scoring moved a variant (ids out, log-probs back)")
    perplexity: float  # exp(mean negative log-likelihood of the text's next tokens), from the device's log-probs
    perplexity_float: float  # the same on the host's float (PyTorch) model, same windows
    perplexity_increase: float = Field(description="perplexity / float perplexity - 1")
    perplexity_increase_ci95: list[float] | None = None  # 95% CI by bootstrap over the windows
    kld_mean: float = Field(description="mean KL(float || device) per position over the top-K tokens + one tail bucket")
    kld_ci95: list[float] | None = None  # 95% CI by bootstrap over the windows
    kld_bound: str | None = Field(None, description="exact, or lower (the tail merged: a lower bound)")
    float_tail_mass_mean: float | None = Field(
        None, description="the float model's mean probability outside its top-K: how much the KLD bound leaves out"
    )
    float_tail_mass_max: float | None = Field(None, description="the same at the least covered position")
    top1_agreement: float  # share of positions whose most likely next token is the float model's
    top1_agreement_ci95: list[float] | None = None  # 95% CI by bootstrap over the windows
    greedy: dict[str, Any] | None = Field(None, description="greedy continuations against the float model's")


class VariantResult(_Open):
    name: str  # the variant (a recipe's name, a search candidate, FILE@setting for a runtime setting)
    format: str  # the file's format: onnx, tflite, coreml, executorch, openvino, ncnn, gguf
    precision: str  # fp32, fp16, int8, int4... as built
    runtime: RuntimeInfo  # the device runtime that ran it, its version, threads and options
    size_bytes: int  # the file's size as delivered
    sha256: str  # the file's content hash (delivery and the measurement cache key on it)
    artifact_path: str | None = None  # where the file is on the host
    lineage: list[LineageStep] = Field(default_factory=list)  # every step that made the file, in order
    load_ms: float | None = None  # the runtime's load of the file on the device
    latency_ms: LatencyMs | None = None  # the timed runs' statistics (a language model: its inter-token times)
    peak_memory_mb: float | None = None  # the agent process's peak RSS on the device while measuring
    memory: dict[str, Any] = Field(default_factory=dict)  # the agent's full memory record (sources and readings)
    energy_mj_per_inference: float | None = None  # None when no energy source could read (energy_reason says why)
    energy_source: str | None = None  # the sensor or method that read the energy
    energy_reason: str | None = None  # why no energy figure, when there is none
    # The agent's full energy record: source, sample rate, baseline, uncertainty
    # (see device_agents/edgekit_agent/energy.py).
    energy: dict[str, Any] = Field(default_factory=dict)
    # Sustained mode: latency bins over time and first vs last segment (edgekit.measure.sustained).
    sustained: dict[str, Any] | None = None
    # Where the numbers come from: {"reused": true, "measured_at": ...} when taken from the measurement cache.
    measurement: dict[str, Any] = Field(default_factory=dict)
    # the task metric, scored on the host from the device's outputs on the eval set; None when no outputs came back
    # (a language model: its perplexity on the eval text)
    accuracy: Accuracy | None = None
    # baseline - variant in the metric's units (for a lower-is-better metric: variant - baseline); > 0 = worse
    accuracy_drop: float | None = None
    # the drop judged on paired per-sample results: 95% CI, p-value, method, the eval set's resolution
    accuracy_stats: dict[str, Any] | None = None
    # baseline p50 / this variant's p50, both measured on the device (> 1 = faster); None when unmeasured
    speedup_vs_baseline: float | None = None
    # eval data at several sample shapes: the baseline's sample-weighted p50 over this variant's (latency_ms.buckets)
    speedup_weighted: float | None = None
    parity: Parity | None = None  # the first output's (the contract field)
    parity_outputs: dict[str, Parity] | None = None  # every output's, by name
    selected: bool = False  # the variant the decision ships
    device_state: dict[str, Any] = Field(default_factory=dict)  # temperatures, clocks, throttling around the run
    # per-op times from the runtime's own profiler, traced to PyTorch modules (edgekit.devices.profile);
    # None = not profiled (deploy profiles the baseline and slower variants, --profile all; search its selection)
    op_profile: OpProfile | None = None
    # a language model's variant (task text-generation): the generation figures and the quality from the
    # device's own log-probabilities; latency_ms then holds the inter-token times of the decode
    generation: Generation | None = None
    quality: LMQuality | None = None  # a language model's: its quality against the float model; None otherwise
    # TFLite's own benchmark_model run of the same .tflite file on the device (--benchmark-binary): its figures
    # under the report's names (latency_ms, peak memory), what that tool does not print null with the reason
    # (edgekit/agent/benchmark_model.py); None when not asked for or not a .tflite file
    benchmark_model: dict[str, Any] | None = None


class Check(_Open):
    name: str  # the check, e.g. accuracy_drop, latency_budget, kld, release_decode
    variant: str | None = None  # the variant it judged (None: the run as a whole)
    value: float | None = None  # the measured value, in the check's units
    limit: float | None = None  # the limit it was held to
    passed: bool  # the check held (a skipped one counts as passed); the gate passes when every check did
    message: str  # one sentence: the figures and the verdict
    # Set on checks against a baseline report (latency regression): the test's p-value and verdict.
    p_value: float | None = None
    # the statistics' verdict: latency_regression (the method's CI excludes 1, and its test agrees where it has one),
    # accuracy_drop (the paired per-sample test); None where no test was made
    significant: bool | None = None
    ratio_ci95: list[float] | None = None  # latency regression: 95% CI of the p50 ratio, this / baseline
    skipped: bool = False  # not applicable here (e.g. a latency budget on an emulated device); says why


class Gate(_Open):
    passed: bool  # every check passed: the exit code is 0 (else 1; `Report.raise_for_gate()` raises GateFailed)
    # every check the gate made (report/gate.py; a language model's: llm/judge.py), failed or not: per judged
    # variant, per conversion hop's parity, and against a baseline report the release checks
    checks: list[Check] = Field(default_factory=list)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]


# --- the device --------------------------------------------------------------------------------------
class BeforeAfter(_Open):
    """A reading taken before and after measuring (a temperature, in °C)."""

    # before the first variant's measurement (battery_temperature_c: when the device session opened); None: unread
    before: float | None = None
    # after the last variant's measurement (battery_temperature_c: when the device session closed); None: unread
    after: float | None = None


class DeviceInfo(_Open):
    """What the report knows about the device: the agent's ``device_facts()`` (arch, os, cpu, cores...),
    the pipeline's (name, transport, clocks and temperature around the run, the target's arch, emulation)
    and, over adb, the transport's Android facts."""

    name: str | None = None  # the inventory or twin name (`--device`), localhost for the local target
    transport: str | None = None  # local | ssh | adb
    # from the agent (device_agents/edgekit_agent/device.py: device_facts)
    arch: str | None = None
    os: str | None = None  # linux, android... (platform.system(), lower case)
    os_release: str | None = None  # the kernel release (platform.release())
    python: str | None = None  # the device's Python that ran the agent
    cpu: str | None = None  # the CPU model name
    cores: int | None = None  # os.cpu_count() on the device
    hostname: str | None = None  # the device's network name (platform.node() on the agent)
    machine_id: str | None = None  # a non-reversible hash; keys the measurement cache
    # the device state before the first variant and after the last (edgekit.pipeline.deploy._device_info)
    governor: str | None = None
    frequency_mhz: float | None = None  # cpu0's scaling_cur_freq before the first variant
    temperature_c: BeforeAfter | None = None  # the hottest thermal zone before the first variant and after the last
    loadavg_before: list[float] | None = None  # the 1/5/15-minute load averages before the first variant
    target_arch: str | None = None  # the target class's arch (what the device should be)
    # an emulated device (the arm64 twin): its timings are not the board's
    emulated: bool | None = None
    emulation: str | None = None  # what emulates it: the inventory entry's notes (the twin) or the page's profile
    latency_representative: bool | None = None  # False when emulated: no latency figure is the board's
    # Android over adb (edgekit.transport.adb: parse_facts): model, SoC, clocks, battery...
    android: dict[str, Any] | None = None
    # Android over adb: the battery's temperature when the session opened and closed (/sys/class/power_supply or
    # dumpsys battery)
    battery_temperature_c: BeforeAfter | None = None

    @property
    def is_latency_representative(self) -> bool:
        """False only when the report says the latency is not the real hardware's (an emulated device)."""
        return self.latency_representative is not False


# --- the variant search (deploy --search) ------------------------------------------------------------
class ShippedFile(_Open):
    file: str | None = None  # OUT/ship/<variant><suffix>
    sha256: str | None = None  # the shipped file's content hash (the measured file's: the same bytes)


class PassRef(_Open):
    name: str  # the pass (quantize_static, prune, distill, convert...)
    config: dict[str, Any] = Field(default_factory=dict)  # its settings as given


class Screening(_Open):
    """A candidate's short measurement on the device (variant_search/run.py, step 3)."""

    p50: float | None = None  # ms, from the short measurement
    ci95: list[float] | None = None  # 95% CI of that median, ms
    accuracy: float | None = None  # the task metric the screening run measured on the device
    peak_memory_mb: float | None = None  # the agent's peak RSS during the screening run, MB
    energy_mj_per_inference: float | None = None  # mJ per inference in the screening run; None when no source read


class SearchCandidate(_Open):
    """One candidate of the search (``Candidate.summary()``): how far it got and why it stopped."""

    name: str  # the candidate's variant name (fp32: the baseline's row)
    status: str | None = None  # baseline | built | dropped | finalist | selected | skipped
    dropped_at: str | None = None  # the stage: host_accuracy | screening | racing | finals ...
    reason: str | None = None  # why it stopped where it did (or why it was selected)
    format: str | None = None  # the built file's format; None when it was not built (or in a language model's search)
    precision: str | None = None  # the built file's precision (fp32, fp16, int8...); None when not built
    size_bytes: int | None = None  # the built file's size, bytes; None when not built
    host_accuracy: float | None = None  # the metric on the host before any device time (the host filter)
    screening: Screening | None = None  # its short measurement on the device; None when it was not screened
    passes: list[PassRef] | None = None  # the passes that built it


class TimelineSpan(_Open):
    stage: str  # preparation | build | host_filter | lock_wait | connect | delivery | screening | finals | tuning ...
    name: str | None = None  # the candidate a build span is for
    start_s: float = 0.0  # seconds from the start of the run
    seconds: float = 0.0  # the span's length
    note: str | None = None  # what happened in it, where worth saying


class Timeline(_Open):
    """Where a search's wall time went (edgekit/timeline.py): one span per stage; the lock wait is
    outside the time budget."""

    started_unix: float | None = None  # when the run started (time.time), to line runs up against each other
    wall_s: float | None = None  # the run's wall time, seconds
    budget_s: float | None = None  # the search's time budget (--time-budget)
    lock_wait_s: float = 0.0  # waiting for the device's lock, outside the budget
    # every finished span in the order recorded (nested ones too; unattributed_s counts the top-level ones)
    spans: list[TimelineSpan] = Field(default_factory=list)
    unattributed_s: float | None = None  # wall time no span covers


class SearchSection(_Open):
    mode: str | None = None  # quick (`deploy` without a recipe: the likeliest winners) | full (--search)
    objective: str | None = None  # p50 | p99 | energy | size
    selected: str | None = None  # the variant chosen to ship; None when nothing qualified
    shipped: ShippedFile | None = None  # the file written to OUT/ship/
    seconds: float | None = None  # the search's wall time
    time_budget_s: float | None = None  # --time-budget (candidates not reached are dropped, saying so)
    # a re-deploy with --baseline kept the last release's choice instead of the fastest finalist (its variant,
    # instead_of, objective, ratio_to_fastest, fastest, tolerance: variant_search/choice.keep_release_choice);
    # None when the fastest shipped
    kept_release_choice: dict[str, Any] | None = None
    timeline: Timeline | None = None  # where the search's wall time went; None in a language model's search
    host: dict[str, Any] | None = None  # the host's CPU and the threads host-side work used (edgekit/host.py)
    # one row per candidate: the baseline's first, then every candidate the search built or dropped, then the
    # skipped ones (a language model's: every file it built, measured or dropped)
    candidates: list[SearchCandidate] = Field(default_factory=list)
    # a latency budget as a goal (variant_search/budget.py, issue #46): the device's latency table, the host's
    # sensitivity, each round's plan with its students (predicted beside measured p50) and the frontier of every
    # device-measured point; None when the budget stayed a gate check
    budget: dict[str, Any] | None = None


# --- the comparison with a previous report (deploy --baseline) ---------------------------------------
class ReportIdentity(_Open):
    """Which report a comparison side is (diff.py: _report_identity)."""

    created_at: str | None = None  # that report's created_at (ISO 8601, UTC)
    edgekit_version: str | None = None  # the edgekit that wrote that report
    target: str | None = None  # that report's target name
    device: str | None = None  # the device's name
    model_sha256: str | None = None  # that report's model.sha256: the source model's hash
    model: str | None = None  # the model's source


# How the release gate judged latency against the baseline report (``ComparedWith.method``), in words;
# the short spellings are the ones release.py records.
LATENCY_METHODS = {
    "ab_interleaved": "A/B interleaved re-measurement of the baseline's shipped variant",
    "ab": "A/B interleaved re-measurement of the baseline's shipped variant",
    "normalized_by_reference": "each variant's p50 relative to the reference variant measured in the same run",
    "normalized": "each variant's p50 relative to the reference variant measured in the same run",
    "direct": "direct comparison of the two runs' raw timings (drift between runs is not removed)",
}


class ComparedWith(ReportIdentity):
    path: str | None = None  # the baseline report's path (--baseline)
    # the baseline report file's sha256 (a language model's release gate: the last release's shipped file's)
    sha256: str | None = None
    # ab_interleaved (ab; a language model's release gate: alternating decode-only turns,
    # edgekit/llm/workload.py measure_ab)
    # | normalized_by_reference (normalized) | direct | same_session (language models before this stop's A/B);
    # None in reports before 1.3
    method: str | None = None
    method_text: str | None = None  # the method in words, as the gate that judged it put it
    # the method's particulars: "requested" (--release-method), and per judged variant the A/B run (baseline_file,
    # same_file, blocks, block_ratios, runs_per_block, order; ab_failed, ab_warnings) or the normalized reference
    # (reference, reference_sha256, reference_ratio_raw); a language model's: the last release's variant and file
    # (llm/release.py)
    method_detail: dict[str, Any] | None = None

    def method_description(self) -> str | None:
        """The method in words, e.g. "A/B interleaved re-measurement of the baseline's shipped variant"."""
        if self.method is None:
            return self.method_text
        return self.method_text or LATENCY_METHODS.get(self.method, self.method)

    def method_line(self) -> str | None:
        """The method in words with its scalar details, e.g. "A/B interleaved ... (blocks 6)"."""
        text = self.method_description()
        if text is None:
            return None
        detail = ", ".join(f"{k} {v}" for k, v in (self.method_detail or {}).items() if not isinstance(v, (dict, list)))
        return text + (f" ({detail})" if detail else "")


class MetricChange(_Open):
    metric: str  # latency_p50_ms | latency_p90_ms | latency_p99_ms | accuracy | peak_memory_mb | size_bytes | energy_mj
    # the baseline report's figure (its counterpart variant), in the metric's units (ms, MB, bytes, mJ, the
    # metric's own); None when not measured there
    before: float | None = None
    after: float | None = None  # this report's figure, same units; None when not measured here
    change: float | None = None  # after - before
    change_rel: float | None = None  # (after - before) / before
    significant: bool | None = None  # None: no significance test applies to this metric
    # latency p50: Mann-Whitney U (or the release method's test, e.g. Wilcoxon over A/B blocks); accuracy of a top-k
    # metric: the two-proportion z-test; None where no test gives one
    p_value: float | None = None
    ratio_ci95: list[float] | None = None  # latency p50 only: 95% CI of the ratio after / before
    # what judged it: e.g. "bootstrap ratio-of-medians CI + Mann-Whitney U", "median 95% CI overlap (no raw
    # timings)", "two-proportion z-test", or the release method in words; None for single-figure metrics
    test: str | None = None
    verdict: str  # e.g. "slower", "faster", "no significant change", "larger", "unchanged", "not measured"
    message: str  # one line for people: the figures and the verdict (latency: the ratio, its CI and the test)
    worse_by: float | None = None  # accuracy: how much worse ``after`` is, in the metric's direction and units

    @property
    def is_regression(self) -> bool:
        return self.verdict in REGRESSION_VERDICTS


REGRESSION_VERDICTS = frozenset({"slower", "worse", "larger"})


class VariantDiff(_Open):
    variant: str  # the current report's variant
    baseline_variant: str | None = None  # set when judged against another name: the previously shipped variant
    # one per metric: latency_p50_ms, latency_p90_ms, latency_p99_ms, accuracy, peak_memory_mb, size_bytes and
    # energy_mj (where either report has energy)
    changes: list[MetricChange] = Field(default_factory=list)

    def get(self, metric: str, default: Any = None) -> MetricChange | None:
        """The change of ``metric`` (e.g. "latency_p50_ms"), or ``default``."""
        return next((c for c in self.changes if c.metric == metric), default)


class ReportDiff(_Open):
    """Changes of ``current`` relative to ``baseline`` (the previous report); built by diff.py."""

    baseline: ReportIdentity  # the previous report compared against
    current: ReportIdentity  # this report
    alpha: float  # significance level of the latency tests (the gate's significance_alpha; default 0.05)
    # the smallest relative p50 change called slower or faster (the gate's max_latency_regression, default 0.10);
    # also the relative change within which p90, p99, memory and energy are "unchanged"
    min_effect: float
    # one per variant of this report with a counterpart in the baseline report (its namesake or the shipped one)
    variants: list[VariantDiff] = Field(default_factory=list)
    added: list[str] = Field(default_factory=list)  # variants only in the current report
    removed: list[str] = Field(default_factory=list)  # variants only in the baseline report
    # what weakens the comparison (targets or devices differ, a reused measurement, thread counts differ, a failed
    # A/B re-measurement, a direct cross-run comparison); a deploy also adds them to the report's warnings
    warnings: list[str] = Field(default_factory=list)

    def variant(self, name: str) -> VariantDiff | None:
        return next((v for v in self.variants if v.variant == name), None)

    @property
    def regressions(self) -> list[tuple[str, MetricChange]]:
        """(variant, change) pairs that got significantly slower or less accurate or bigger."""
        return [(v.variant, c) for v in self.variants for c in v.changes if c.is_regression]


# --- a fleet run (deploy --devices/--pool; edgekit/orchestration/fleet.py) -------------------------------------------
class FleetUnit(_Open):
    """One unit of the fleet: its state (measured | failed, with the error), its eval shard, its
    per-variant latency and its own gate's verdict."""

    name: str  # the unit's inventory name
    state: str  # measured | failed
    error: str | None = None  # why it failed
    error_kind: str | None = None  # the failure's kind (the exception's, or its class name)
    exit_code: int | None = None  # a failed unit's error's exit code (2 bad input, 3 device)
    seconds: float | None = None  # the unit's wall time
    shard: list[int] | None = None  # [start, stop) of the eval set it scored (sharded eval)
    shard_accuracy: dict[str, float | None] | None = None  # the metric on its shard alone, per variant
    gate_passed: bool | None = None  # its own report's gate (None: not measured)
    failed_checks: list[str] = Field(default_factory=list)  # its own gate's failed checks, "name [variant]"
    latency_ms: dict[str, dict[str, float]] = Field(default_factory=dict)  # variant -> p50/p90/p99/mean
    # variant -> the device's wall seconds for its eval pass (its shard, when sharded), as the agent timed it
    eval_seconds: dict[str, float | None] = Field(default_factory=dict)
    transport: str | None = None  # local | ssh | adb | browser, from its report's device; None when it has no report
    hostname: str | None = None  # as the agent on the unit reported it


class FleetVariant(_Open):
    """One variant across the units: median of the units' p50s, spread, worst and best unit."""

    name: str  # the variant
    units: int  # units that measured it
    median_of_medians_ms: float  # the median over the units of each unit's p50
    spread_ms: float  # worst unit's p50 - best unit's p50
    spread_rel: float | None = None  # spread_ms / median_of_medians_ms (over 0.2 is a report warning)
    worst_unit: str  # the unit with the highest p50
    worst_p50: float  # ms
    best_unit: str  # the unit with the lowest p50
    best_p50: float  # ms


class FleetSection(_Open):
    mode: str  # replicated | sharded (the eval set)
    gate: str  # worst | median: which unit's report the gate judged
    judged_unit: str  # the unit whose report the gate judged (the worst, or the median, measured unit)
    judged_variants: list[str] = Field(default_factory=list)  # what the units are ranked on (all but the baseline)
    min_devices: int  # units that must be measured for the gate to pass (--min-devices; default all)
    measured: int  # units measured
    total: int  # units in the fleet
    eval_samples: int | None = None  # the eval set's samples
    eval_covered: int | None = None  # sharded: the samples scored (a failed unit's shard is missing)
    units: list[FleetUnit] = Field(default_factory=list)  # every unit of the fleet, measured or failed
    variants: list[FleetVariant] = Field(default_factory=list)  # every variant a unit measured a p50 for


# --- the report ----------------------------------------------------------------------------------------
class Decision(_Open):
    """What a deploy says to ship among the measured variants, and why each other one lost."""

    ship: str | None = None  # the variant to ship; None when none qualified
    reason: str = ""  # why that one: the objective's figure and its comparison with the baseline
    proved_faster: bool = False  # the shipped variant's p50 CI lies below the baseline's
    lost: dict[str, str] = Field(default_factory=dict)  # every other variant: why it did not ship


class Report(_Open):
    schema_version: str = SCHEMA_VERSION  # MAJOR.MINOR: another major is refused when read
    edgekit_version: str  # the edgekit that wrote the report
    created_at: str  # ISO 8601, UTC
    target: str  # the target file's name (targets/NAME.yaml)
    device: DeviceInfo  # what the agent reported about the device it ran on
    model: dict[str, Any] = Field(default_factory=dict)  # source, sha256, format, inputs
    settings: dict[str, Any] = Field(default_factory=dict)  # the run's measure, gate, eval and search settings
    baseline: str  # the variant the others are compared with (the float model's file)
    variants: list[VariantResult]  # every variant measured on the device
    gate: Gate  # the release gate's verdict
    # deploy: the variant to ship and why the others lost (report/decision.py); None in a search
    decision: Decision | None = None
    warnings: list[str] = Field(default_factory=list)  # what a reader must know about the figures (emulation, caps)
    # The previous report this run was compared with (`--baseline`), and the comparison.
    compared_with: ComparedWith | None = None
    # the per-variant diff against it (diff.py, report/release.py); None in a language model's report, whose
    # release checks are in the gate
    comparison: ReportDiff | None = None
    # The variant search (`deploy --search`): the objective, what shipped, every candidate.
    search: SearchSection | None = None
    # A fleet run: every unit's figures and state, the shard assignment, the judged unit (an optional
    # section, absent from single-device reports: no schema bump needed to read either).
    fleet: FleetSection | None = None
    # the baseline's per-op profile against each other profiled variant's (op types, one-line reason)
    profile_diffs: list[ProfileDiff] = Field(default_factory=list)

    def metric_label(self) -> str:
        """The metric's column header, e.g. "top1 %", "miou %", "mse", "psnr dB"."""
        acc = next((v.accuracy for v in self.variants if v.accuracy is not None), None)
        if acc is None:
            return "accuracy"
        return f"{acc.metric} {acc.units}".strip()

    def metric_line(self) -> str:
        """One sentence on what scored the eval pass."""
        if (self.model or {}).get("task") == "text-generation":
            ev = (self.settings or {}).get("eval_text") or {}
            gen = (self.settings or {}).get("generate") or {}
            return (
                f"task: text-generation ({self.model.get('architecture')}); quality from the device's own "
                f"log-probabilities on {ev.get('windows')} windows of {ev.get('window_tokens')} tokens of "
                f"{ev.get('path')} against the float model (perplexity, KL divergence over {_kld_tokens(self)}, "
                f"top-1 agreement); prefill at {gen.get('prompt_lengths')} tokens, decode from an empty cache "
                f"(context {gen.get('context')})"
            )
        m = (self.settings or {}).get("metric") or {}
        acc = next((v.accuracy for v in self.variants if v.accuracy is not None), None)
        if not m and acc is None:
            return "metric: none measured"
        name = m.get("name") or (acc.metric if acc else "?")
        direction = m.get("direction") or (acc.direction if acc else "higher")
        against = m.get("against") or (acc.against if acc else "labels")
        outs = m.get("outputs") or (acc.outputs if acc else None)
        n = acc.n if acc else None
        return (
            f"metric: {name} ({direction} is better) on {n if n is not None else '?'} eval samples, against "
            f"{'the labels' if against == 'labels' else 'the float model outputs (no labels)'}"
            + (f", reading output(s) {', '.join(outs)}" if outs else "")
            + (
                f"; model inputs {', '.join(map(str, self.settings['eval_inputs']))}"
                if self.settings.get("eval_inputs")
                else ""
            )
            + self._buckets_clause()
        )

    def _buckets_clause(self) -> str:
        """Eval data at several shapes: which shape the latency columns are at, and where the rest is."""
        buckets = (self.settings or {}).get("eval_shape_buckets")
        if not buckets:
            return ""
        shapes = "; ".join(f"{' '.join(str(tuple(s)) for s in b['shapes'])} x{b['samples']}" for b in buckets)
        return (
            f"; {len(buckets)} sample shapes ({shapes}): every sample scored, latency columns at the first "
            "(each shape's p50 and the sample-weighted p50: latency_ms.buckets, weighted_p50 in report.json)"
        )

    @property
    def shipped(self) -> VariantResult | None:
        """The variant this run says to ship (the decision's, or the search's selection); None when nothing
        qualified or the run chose nothing (a recipe run of one variant)."""
        name = (self.decision.ship if self.decision is not None else None) or (
            self.search.selected if self.search is not None else None
        )
        return self.variant(name) if name else None

    def raise_for_gate(self) -> "Report":
        """Raise :class:`edgekit.errors.GateFailed` (exit 1) when the gate failed; return the report otherwise,
        so a release pipeline can write ``report = edgekit.deploy(...).raise_for_gate()``."""
        if not self.gate.passed:
            failed = [
                (f"{c.name}[{c.variant}]" if c.variant else c.name, c.message) for c in self.gate.checks if not c.passed
            ]
            raise GateFailed(
                f"the gate failed on target {self.target}: " + "; ".join(f"{n}: {m}" for n, m in failed),
                failed=failed,
                hint="report.md / report.html say what each check measured",
            )
        return self

    def variant(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r} in report; variants: {[v.name for v in self.variants]}")

    def diff(self, other: "Report", *, alpha: float = 0.05, min_effect: float = 0.10) -> ReportDiff:
        """What changed in this report relative to ``other`` (e.g. the last release): a ReportDiff
        (``diff.diff_reports(other, self)``)."""
        diff: ReportDiff = _provided("diff_reports")(other, self, alpha=alpha, min_effect=min_effect)
        return diff

    # --- persistence -----------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise BadInputError(f"report {p} not found") from exc
        except (OSError, ValueError) as exc:
            raise BadInputError(f"report {p} is not readable JSON ({exc})") from exc
        if not isinstance(data, dict) or "schema_version" not in data:
            raise BadInputError(f"{p} is not an edgekit report (no schema_version)")
        major = str(data["schema_version"]).split(".")[0]
        if major != SCHEMA_VERSION.split(".")[0]:
            raise BadInputError(
                f"{p} has report schema {data['schema_version']}; this edgekit reads {SCHEMA_VERSION.split('.')[0]}.x",
                hint="open it with the edgekit version that wrote it (see its edgekit_version field)",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise BadInputError(
                f"{p} is not a valid edgekit report: {exc.error_count()} problem(s), first: "
                f"{exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"
            ) from exc

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write report.json, report.md, report.html and junit.xml into ``out_dir`` (``write.write_report``)."""
        written: dict[str, Path] = _provided("write_report")(self, out_dir)
        return written


# The views import this module and never the reverse, so the schema is in no import cycle. The two
# methods above that need a view call the function its module hands over here when it is imported;
# edgekit/report/__init__.py imports both modules, and Python runs it before any module of the
# package, so they are here whenever this module is.
_PROVIDED: dict[str, Callable[..., Any]] = {}


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def provides(fn: _Fn) -> _Fn:
    """Decorator: ``fn`` (``diff_reports``, ``write_report``) is what the Report method of the same
    job calls."""
    _PROVIDED[fn.__name__] = fn
    return fn


def _provided(name: str) -> Callable[..., Any]:
    try:
        return _PROVIDED[name]
    except KeyError:  # only if edgekit/report/__init__.py stopped importing its module
        raise RuntimeError(
            f"edgekit.report: no {name} was provided (edgekit/report/__init__.py imports diff.py and write.py)"
        ) from None


def _kld_tokens(report: Report) -> str:
    """What a language model's KLD was summed over, in words (the report's metric line)."""
    q = next((v.quality for v in report.variants if v.quality), None)
    if q is None:
        return "the float model's top tokens"
    if q.coverage_target is None:
        return f"the float model's top-{q.top_k} tokens"
    cut = f", the flattest cut to {q.top_k_capped_at}" if q.top_k_capped_at else ""
    return (
        f"the float model's most likely tokens holding {q.coverage_target:.1%} of its mass at each position "
        f"({q.top_k_mean or 0:.0f} on average, up to {q.top_k}{cut})"
    )
