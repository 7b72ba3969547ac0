"""Requests to and results from the agent (protocol version 2: every eval output comes back)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact import Artifact
from ..errors import AgentError, DataError, DeviceError
from ..formats import RUNTIME_FOR_FORMAT
from ..targets import MeasureDefaults
from ..transport.base import Transport
from .bundle import BundleDeployer

PROTOCOL = 2
AGENT_TIMEOUT_MARGIN_S = 300.0  # on top of max_seconds: load, warmup and the eval pass


@dataclass(frozen=True)
class AgentResult:
    variant: str
    doc: dict[str, Any]  # the agent's JSON document, as printed
    outputs: Any = None  # every eval-set output pulled back from the device (list of arrays) or None


def tensor_specs(artifact: Artifact, source_io) -> tuple[list[dict], list[dict]]:
    ins = []
    for spec, src in zip(artifact.io.inputs, source_io.inputs):
        d = spec.model_dump(mode="json")
        d["source_dtype"] = src.dtype
        ins.append(d)
    outs = [o.model_dump(mode="json") for o in artifact.io.outputs]
    return ins, outs


def build_request(*, variant: str, artifact: Artifact, model_remote: str, source_io, measure: MeasureDefaults,
                  eval_remote: str | None, x_keys, y_key, outputs_remote: str | None,
                  energy_sources=(), max_seconds: float = 120.0, runtime: str | None = None) -> dict:
    ins, outs = tensor_specs(artifact, source_io)
    return {
        "protocol": PROTOCOL,
        "variant": variant,
        "model": model_remote,
        "model_sha256": artifact.sha256,
        "format": artifact.format.value,
        "runtime": runtime or RUNTIME_FOR_FORMAT[artifact.format],
        "threads": measure.threads,
        "warmup": measure.warmup,
        "runs": measure.runs,
        "min_seconds": measure.min_seconds,
        "max_runs": measure.max_runs,
        "max_seconds": max_seconds,
        "inputs": ins,
        "outputs": outs,
        # labels stay on the host: the device returns outputs, the host scores them
        "eval": _eval_request(eval_remote, x_keys),
        "outputs_path": outputs_remote,
        "energy": {"sources": list(energy_sources)},
    }


def _eval_request(eval_remote, x_keys) -> dict | None:
    """``eval_remote``: the remote .npz, or a list of shards (array name -> remote .npy)."""
    if not eval_remote:
        return None
    if isinstance(eval_remote, str):
        return {"path": eval_remote, "x_keys": list(x_keys), "batch_size": 64}
    return {"shards": [{k: sh[k] for k in x_keys} for sh in eval_remote], "x_keys": list(x_keys), "batch_size": 64}


def run_request(deployer: BundleDeployer, request: dict, *, timeout: float | None = None) -> AgentResult:
    """Send one request, run the agent on it, parse its single JSON document, pull its outputs."""
    import numpy as np

    t: Transport = deployer.t
    with tempfile.TemporaryDirectory(prefix="edgekit-req-") as td:
        req_path = Path(td) / "request.json"
        req_path.write_text(json.dumps(request, sort_keys=True), encoding="utf-8")
        remote_req = deployer.deliver([req_path])[req_path]
        res = t.run([t.python, deployer.agent, remote_req],
                    timeout=timeout or request.get("max_seconds", 120.0) + AGENT_TIMEOUT_MARGIN_S)
        doc = parse_agent_stdout(res.stdout, res.stderr, res.returncode)
        if not doc.get("ok"):
            err = doc.get("error") or {}
            kind, msg = err.get("kind", "unknown"), err.get("message", "(no message)")
            if kind in ("bad_data",):
                raise DataError(f"the device rejected the eval data: {msg}")
            hint = None
            if kind == "runtime_missing":
                hint = "install the runtime on the device (edgekit provisions it from a wheelhouse over SSH)"
            raise DeviceError(f"agent failed on variant '{request['variant']}' ({kind}): {msg}", hint=hint)
        outputs = None
        if request.get("outputs_path") and doc.get("outputs_path"):
            local = Path(td) / "outputs.npz"
            t.pull(doc["outputs_path"], local)
            outputs = load_outputs(local)
    return AgentResult(variant=request["variant"], doc=doc, outputs=outputs)


def load_outputs(path: Path) -> list:
    """The agent's outputs file (``output_0``, ``output_1``...) as a list of arrays, in output order."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            keys = sorted((k for k in z.files if k.startswith("output_")), key=lambda k: int(k.split("_")[1]))
            return [z[k] for k in keys]
    except (OSError, ValueError) as exc:
        raise AgentError(f"the agent's outputs file {path.name} is not readable ({exc})") from exc


def parse_agent_stdout(stdout: str, stderr: str, returncode: int) -> dict:
    text = stdout.strip()
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise AgentError(
            f"the agent did not print one JSON document (exit {returncode}); stdout: {text[:200]!r}; "
            f"stderr tail: {stderr.strip()[-600:]!r}",
            hint="run `edgekit doctor` or the agent's --probe on the device to see what is wrong") from exc
    if doc.get("protocol") != PROTOCOL:
        raise AgentError(f"agent protocol {doc.get('protocol')} does not match the host's {PROTOCOL}")
    return doc
