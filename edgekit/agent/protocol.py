"""Requests to and results from the agent (protocol version 2: every eval output comes back).

The boundary is typed on both sides: an :class:`AgentRequest` is built once (every measurement
option folded in) and validated once; the agent's one JSON document is parsed once into an
:class:`AgentResult` (typed fields, the raw document kept for the measurement cache). A variant the
agent could not run is an :class:`AgentRunFailed` carrying the agent's error *kind*, so callers never
match message text to tell a bad candidate from a broken link.
"""

from __future__ import annotations

import json
import math
import shlex
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..artifact import Artifact, IOSpec
from ..errors import AgentError, DataError, DeviceError
from ..formats import RUNTIME_FOR_FORMAT
from ..inputs.targets import MeasureDefaults
from ..transport.base import Transport
from .bundle import BundleDeployer

if TYPE_CHECKING:
    from ..inputs.stateful import Stream

PROTOCOL = 2
AGENT_TIMEOUT_MARGIN_S = 300.0  # on top of max_seconds: load, warmup and the eval pass
# Error kinds that belong to the model/variant (another candidate may still run on this device).
VARIANT_FAULTS = frozenset({"model_load_failed", "inference_failed", "runtime_missing", "bad_request"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnergyRequest(_Strict):
    sources: list[str] = Field(default_factory=list)
    external_command: list[str] | None = None
    sysfs_root: str | None = None


class EvalRequest(_Strict):
    path: str | None = None  # the remote .npz
    shards: list[dict[str, str]] | None = None  # or remote .npy shards: array name -> path
    x_keys: list[str]
    batch_size: int = 64
    # shards at several sample shapes, grouped: shards per shape bucket, in order (edgekit.inputs.data.Bucket);
    # the agent writes each bucket's outputs apart and times one chunk of each
    buckets: list[int] | None = None


class ConstantInput(_Strict):
    dtype: str
    shape: list[int]
    values: list[int | float]  # flattened, row-major


class StateLink(_Strict):
    output: str  # the output holding the next state
    input: str  # the input it is fed back to
    shape: list[int]  # the zeros the state starts from


class StreamRequest(_Strict):
    """Inputs the eval data does not feed (edgekit/inputs/stateful.py): constants fed with every run; state
    inputs starting as zeros and taking their output after each run (the eval pass then runs one sample
    at a time in order)."""

    constants: dict[str, ConstantInput] = Field(default_factory=dict)
    state: list[StateLink] = Field(default_factory=list)


class SustainedRequest(_Strict):
    seconds: float
    bin_s: float
    segment_s: float

    @classmethod
    def for_seconds(
        cls, seconds: float, *, bin_s: float | None = None, segment_s: float | None = None
    ) -> SustainedRequest:
        """Bins of ~1/30 of the run (>= 1 s), first/last segments of a minute (a quarter of the run when it is
        shorter than four minutes); measure/sustained.py compares those segments."""
        if seconds <= 0:
            raise ValueError("sustained seconds must be > 0")
        return cls(
            seconds=float(seconds),
            bin_s=float(bin_s or max(1.0, seconds / 30.0)),
            segment_s=float(segment_s or min(60.0, seconds / 4.0)),
        )


class ScoreRequest(_Strict):
    windows: str  # remote .npy int32 [W, T]: teacher-forced windows of the eval text
    ids: str | None = None  # remote .npy int32 [W, T-1, K], or [N] with offsets: the ids whose log-probs come back
    offsets: str | None = None  # remote .npy int64 [W*(T-1)+1]: position p's ids are ids[offsets[p]:offsets[p+1]]


class GreedyRequest(_Strict):
    prompts: list[list[int]]
    new_tokens: int


class GenerateRequest(_Strict):
    """The generation workload (device_agents/edgekit_agent/generation.py; built by edgekit/llm/request.py)."""

    context: int  # the positions the file takes (an ExecuTorch file's static cache)
    prompt_ids: list[int]  # prompts are its first N tokens
    prompt_lengths: list[int]  # prefill timed at each; the first is the cold TTFT's
    prefill_repeats: int = 5
    filled_at: int  # the prompt before the decode from a filled cache
    decode_tokens: int  # the steps of that decode
    score: ScoreRequest | None = None
    greedy: GreedyRequest | None = None


class AgentRequest(_Strict):
    """What the agent reads (device_agents/edgekit_agent/measure.py)."""

    protocol: int = PROTOCOL
    variant: str
    model: str
    model_sha256: str
    # the model's other files by suffix (OpenVINO's ".bin" beside the ".xml"): each is delivered by its
    # own content hash, so the runner is told where each one is
    companions: dict[str, str] | None = None
    format: str
    runtime: str
    threads: int = 1
    warmup: int = 10
    runs: int = 50
    min_seconds: float = 1.0
    max_runs: int = 5000
    max_seconds: float = 120.0
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    eval: EvalRequest | None = None  # labels stay on the host: the device returns outputs, the host scores
    outputs_path: str | None = None
    energy: EnergyRequest = Field(default_factory=EnergyRequest)
    warmup_mode: Literal["fixed", "auto"] | None = None
    sustained: SustainedRequest | None = None
    sysfs_root: str | None = None
    # runtime options the runner applies (onnxruntime: graph_optimization_level, execution_mode,
    # inter_op_threads); a search varies them, the shipped artifact records the ones it needs
    runtime_options: dict[str, Any] | None = None
    # A/B: this model (A) and ab["model"] (B) timed in alternating blocks in one agent process
    ab: dict[str, Any] | None = None
    # per-op profile: the runtime's own profiler over this many extra runs after the timed runs
    # (agent answer: "op_profile"); None = no profile
    profile: dict[str, Any] | None = None
    # constant and state inputs (names as in ``inputs``/``outputs``); None: the eval data feeds every input
    stream: StreamRequest | None = None
    # a language model's generation workload instead of the fixed-graph timing and eval pass
    generate: GenerateRequest | None = None

    @model_validator(mode="after")
    def _stream_names(self) -> "AgentRequest":
        if self.stream is None:
            return self
        ins, outs = [i.get("name") for i in self.inputs], [o.get("name") for o in self.outputs]
        fed = [*self.stream.constants, *(s.input for s in self.stream.state)]
        for name in fed:
            if name not in ins:
                raise ValueError(f"stream input {name!r} is not one of the model's inputs {ins}")
        if len(set(fed)) != len(fed):
            raise ValueError(f"stream feeds an input twice ({fed})")
        for s in self.stream.state:
            if s.output not in outs:
                raise ValueError(f"stream state output {s.output!r} is not one of the model's outputs {outs}")
        for name, c in self.stream.constants.items():
            if len(c.values) != math.prod(c.shape):
                raise ValueError(f"constant {name!r}: {len(c.values)} values for shape {c.shape}")
        return self

    def to_json(self) -> str:
        return json.dumps(self.wire(), sort_keys=True)

    def wire(self) -> dict[str, Any]:
        """The JSON object sent (and hashed by the measurement cache): unset options left out."""
        return self.model_dump(mode="json", exclude_none=True)

    @property
    def timeout_s(self) -> float:
        return self.max_seconds + AGENT_TIMEOUT_MARGIN_S


@dataclass(frozen=True)
class MeasureOptions:
    """The measurement extras beyond the target's measure block (deploy's --warmup-mode,
    --sustained, --energy-command, max_seconds), checked once by :func:`measure_options`."""

    warmup_mode: Literal["fixed", "auto"] | None = None
    sustained_seconds: float | None = None
    energy_command: tuple[str, ...] | None = None
    max_seconds: float = 120.0


def tensor_specs(artifact: Artifact, source_io: IOSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ins = []
    for spec, src in zip(artifact.io.inputs, source_io.inputs):
        d = spec.model_dump(mode="json")
        d["source_dtype"] = src.dtype
        ins.append(d)
    outs = [o.model_dump(mode="json") for o in artifact.io.outputs]
    return ins, outs


def eval_request(
    eval_remote: str | Sequence[Mapping[str, str]] | None, x_keys: Iterable[str], buckets: Iterable[int] | None = None
) -> EvalRequest | None:
    """``eval_remote``: the remote .npz, or a list of shards (array name -> remote .npy); ``buckets``:
    the number of shards in each shape bucket (``Dataset.shards_per_bucket``), None for one shape."""
    if not eval_remote:
        return None
    if isinstance(eval_remote, str):
        return EvalRequest(path=eval_remote, x_keys=list(x_keys))
    return EvalRequest(
        shards=[{k: sh[k] for k in x_keys} for sh in eval_remote],
        x_keys=list(x_keys),
        buckets=list(buckets) if buckets else None,
    )


def build_request(
    *,
    variant: str,
    artifact: Artifact,
    model_remote: str | list[str],
    source_io: IOSpec,
    measure: MeasureDefaults,
    eval_remote: str | Sequence[Mapping[str, str]] | None,
    x_keys: Iterable[str],
    outputs_remote: str | None,
    energy_sources: Iterable[str] = (),
    options: MeasureOptions | None = None,
    runtime: str | None = None,
    runtime_options: dict[str, Any] | None = None,
    stream: Stream | None = None,
    eval_buckets: Iterable[int] | None = None,
) -> AgentRequest:
    """``stream``: the run's edgekit.inputs.stateful.Stream (constant and state inputs), or None."""

    o = options or MeasureOptions()
    ins, outs = tensor_specs(artifact, source_io)
    sources = list(energy_sources)
    if o.energy_command and "external_command" not in sources:
        sources.append("external_command")
    max_seconds = max(o.max_seconds, o.sustained_seconds or 0.0)  # the host waits for the whole sustained run
    remotes = [model_remote] if isinstance(model_remote, str) else list(model_remote)  # artifact.files' order
    companions = {f.suffix: r for f, r in zip(artifact.files[1:], remotes[1:])} or None
    return AgentRequest(
        variant=variant,
        model=remotes[0],
        model_sha256=artifact.sha256,
        companions=companions,
        format=artifact.format.value,
        runtime=runtime or RUNTIME_FOR_FORMAT[artifact.format],
        threads=measure.threads,
        warmup=measure.warmup,
        runs=measure.runs,
        min_seconds=measure.min_seconds,
        max_runs=measure.max_runs,
        max_seconds=max_seconds,
        inputs=ins,
        outputs=outs,
        eval=eval_request(eval_remote, x_keys, eval_buckets),
        outputs_path=outputs_remote,
        energy=EnergyRequest(sources=sources, external_command=list(o.energy_command) if o.energy_command else None),
        warmup_mode=o.warmup_mode,
        runtime_options={**artifact.runtime_options, **(runtime_options or {})} or None,
        sustained=SustainedRequest.for_seconds(o.sustained_seconds) if o.sustained_seconds else None,
        stream=StreamRequest(**stream.wire(artifact.io, source_io)) if stream is not None else None,
    )


# --- the agent's answer ---------------------------------------------------------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class LatencyDoc(_Open):
    warmup: int
    runs: int
    raw: list[float]
    raw_decimation: int | None = None


class RuntimeDoc(_Open):
    name: str
    version: str | None = None
    threads: int | None = None
    delegate: str | None = None


class AgentDoc(_Open):
    """The agent's JSON document for one measured variant."""

    protocol: int
    ok: bool
    agent_version: str | None = None
    variant: str | None = None
    device: dict[str, Any] = Field(default_factory=dict)
    device_state: dict[str, Any] = Field(default_factory=dict)
    runtime: RuntimeDoc
    load_ms: float | None = None
    latency_ms: LatencyDoc
    sustained: dict[str, Any] | None = None
    memory: dict[str, Any] = Field(default_factory=dict)
    energy: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    eval: dict[str, Any] | None = None
    outputs_path: str | None = None

    def warmup_fields(self) -> dict[str, Any]:
        return {k: v for k, v in (self.latency_ms.model_extra or {}).items() if k.startswith("warmup_")}

    def timer_fields(self) -> dict[str, Any]:
        """How a page timed its runs (the browser agent): the timer's resolution and the iterations one
        timed sample spans (a fast model is timed in batches); none for a native agent."""
        extra = self.latency_ms.model_extra or {}
        return {k: extra[k] for k in ("timer_resolution_ms", "iterations_per_sample") if k in extra}


@dataclass(frozen=True)
class AgentResult:
    variant: str
    doc: dict[str, Any]  # the agent's JSON document, as printed (what the measurement cache stores)
    outputs: Any = None  # every eval-set output pulled back from the device (list of arrays) or None

    @property
    def parsed(self) -> AgentDoc:
        return parse_result_doc(self.doc, self.variant)


def parse_result_doc(doc: dict[str, Any], variant: str) -> AgentDoc:
    from pydantic import ValidationError

    try:
        return AgentDoc.model_validate(doc)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise AgentError(
            f"the agent's answer for variant '{variant}' is malformed: {'.'.join(map(str, e['loc']))} {e['msg']}",
            hint="the agent on the device may be from another edgekit version",
        ) from exc


class AgentRunFailed(DeviceError):
    """The agent ran and reported that it could not measure this variant (``kind`` from the agent)."""

    def __init__(self, message: str, *, kind: str, variant: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind
        self.variant = variant

    @property
    def variant_fault(self) -> bool:
        """True when the failure belongs to the model (another variant may run on this device)."""
        return self.kind in VARIANT_FAULTS


def run_request(deployer: BundleDeployer, request: AgentRequest, *, timeout: float | None = None) -> AgentResult:
    """Send one request, run the agent on it, parse its single JSON document, pull its outputs."""
    t: Transport = deployer.t
    with tempfile.TemporaryDirectory(prefix="edgekit-req-") as td:
        req_path = Path(td) / "request.json"
        req_path.write_text(request.to_json(), encoding="utf-8")
        remote_req = deployer.deliver([req_path], kind="request")[req_path]
        res = t.run([t.python, deployer.agent, remote_req], timeout=timeout or request.timeout_s)
        doc = parse_agent_stdout(res.stdout, res.stderr, res.returncode)
        if not doc.get("ok"):
            err = doc.get("error") or {}
            kind, msg = err.get("kind", "unknown"), err.get("message", "(no message)")
            if kind in ("bad_data",):
                raise DataError(f"the device rejected the eval data: {msg}")
            # runtime_missing's hint (the command that installs it there) is the session's: it knows the device
            raise AgentRunFailed(
                f"agent failed on variant '{request.variant}' ({kind}): {msg}", kind=kind, variant=request.variant
            )
        parse_result_doc(doc, request.variant)  # a malformed answer fails here, once
        outputs = None
        if request.outputs_path and doc.get("outputs_path"):
            local = Path(td) / "outputs.npz"
            t.pull(doc["outputs_path"], local)
            outputs = load_outputs(local)
    return AgentResult(variant=request.variant, doc=doc, outputs=outputs)


class BucketOutputs(list[list[Any]]):
    """The outputs of an eval set at several sample shapes: per shape bucket, the list of the model's
    outputs (edgekit.metrics.evaluate.EvalPlan scores them bucket by bucket)."""


def save_outputs(path: Path, outputs: Sequence[Any]) -> None:
    """Write outputs as the agent does (what :func:`load_outputs` reads back): ``output_K``, or
    ``bucket_J_output_K`` for a BucketOutputs."""
    import numpy as np

    if isinstance(outputs, BucketOutputs):
        named = {f"bucket_{j}_output_{i}": np.asarray(o) for j, b in enumerate(outputs) for i, o in enumerate(b)}
    else:
        named = {f"output_{i}": np.asarray(o) for i, o in enumerate(outputs)}
    np.savez(path, **cast(dict[str, Any], named))


def load_outputs(path: Path) -> list[Any]:
    """The agent's outputs file (``output_0``, ``output_1``...) as a list of arrays, in output order."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            if any(k.startswith("bucket_") for k in z.files):  # bucket_J_output_K: one list per shape bucket
                per: dict[int, dict[int, Any]] = {}
                for k in z.files:
                    _, j, _, i = k.split("_")
                    per.setdefault(int(j), {})[int(i)] = z[k]
                return BucketOutputs([[per[j][i] for i in sorted(per[j])] for j in sorted(per)])
            keys = sorted((k for k in z.files if k.startswith("output_")), key=lambda k: int(k.split("_")[1]))
            return [z[k] for k in keys]
    except (OSError, ValueError) as exc:
        raise AgentError(f"the agent's outputs file {path.name} is not readable ({exc})") from exc


def parse_agent_stdout(stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    text = stdout.strip()
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise AgentError(
            f"the agent did not print one JSON document (exit {returncode}); stdout: {text[:200]!r}; "
            f"stderr tail: {stderr.strip()[-600:]!r}",
            hint="run `edgekit doctor` or the agent's --probe on the device to see what is wrong",
        ) from exc
    if doc.get("protocol") != PROTOCOL:
        raise AgentError(f"agent protocol {doc.get('protocol')} does not match the host's {PROTOCOL}")
    return doc


def split_command(cmd: list[str] | str | None) -> tuple[str, ...] | None:
    if not cmd:
        return None
    return tuple(shlex.split(cmd)) if isinstance(cmd, str) else tuple(str(a) for a in cmd)
