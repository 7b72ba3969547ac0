"""Measurement cache: a variant measured on a device is not measured again for nothing.

A result is keyed by everything that decides it: the model (its sha256, part of the request), the
runtime and its version on the device, the thread count and every other measurement setting (the
whole request, whose remote paths are content hashes), the device's identity (inventory name,
transport, hostname, machine id, CPU, kernel) and the agent (version and source hash). A re-run
within ``max_age`` reuses the stored agent document and eval outputs unless ``remeasure`` is set;
the report marks each reused variant (``measurement.reused``) and says when it was measured. A result measured on
a busy device (other processes above ``BUSY_OTHER_CPU`` of its CPU) is not stored: its figures carry that
contention, and a later run on a quiet device must measure its own rather than inherit them.

Location: ``$EDGEKIT_HOME/cache/measurements`` when EDGEKIT_HOME is set, else
``$XDG_CACHE_HOME/edgekit/measurements``. ``EDGEKIT_NO_CACHE=1`` or ``EDGEKIT_NO_MEASURE_CACHE=1``
turns it off. Entries are written to a temporary folder and renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..agent.bundle import agent_source
from ..agent.protocol import AgentResult, load_outputs, parse_agent_stdout, save_outputs
from ..errors import AgentError
from ..fsutil import cache_dir, sha256_file
from .stats import BUSY_OTHER_CPU

if TYPE_CHECKING:
    from ..agent.protocol import AgentRequest, AgentResult

DEFAULT_MAX_AGE_S = 24 * 3600.0  # a day: long enough for a re-run, short enough to see a new OS image
FORMAT = 2  # 2: outputs are a list of arrays (every model output)


def measure_cache_root() -> Path:
    return cache_dir("measurements")


def measure_cache_disabled() -> bool:
    return any(os.environ.get(k, "").strip() not in ("", "0") for k in ("EDGEKIT_NO_CACHE", "EDGEKIT_NO_MEASURE_CACHE"))


def device_identity(probe_doc: dict, device_name: str | None, transport_kind: str) -> dict:
    facts = probe_doc.get("device") or {}
    return {"name": device_name, "transport": transport_kind,
            **{k: facts.get(k) for k in ("hostname", "machine_id", "cpu", "arch", "cores", "os", "os_release")},
            # a browser device: its version, the page's WASM features (isolation), the page agent's code and
            # the CPU throttle rate of an emulated phone
            **{k: facts[k] for k in ("browser", "wasm", "page_agent", "browser_emulation") if k in facts}}


def measurement_key(request: Any, *, runtime_version: str | None, identity: dict, agent: dict) -> str:
    wire = request.wire() if hasattr(request, "wire") else dict(request)
    req = {k: v for k, v in wire.items() if k != "variant"}  # the name does not change a number
    doc = {"format": FORMAT, "request": req, "runtime_version": runtime_version, "device": identity, "agent": agent}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Cached:
    doc: dict
    outputs: Any
    measured_at: str
    key: str


@dataclass
class MeasureCache:
    """Stores agent documents (+ eval outputs) by key; ``reused`` lists what a run took from it."""

    root: Path = field(default_factory=measure_cache_root)
    max_age_s: float = DEFAULT_MAX_AGE_S

    def _entry(self, key: str) -> Path:
        return Path(self.root) / key[:2] / key

    def get(self, key: str, now: _dt.datetime | None = None) -> Cached | None:
        entry = self._entry(key)
        try:
            meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
            measured = _dt.datetime.fromisoformat(meta["measured_at"])
            now = now or _dt.datetime.now(_dt.timezone.utc)
            if (now - measured).total_seconds() > self.max_age_s or meta.get("format") != FORMAT:
                return None
            doc = json.loads((entry / "doc.json").read_text(encoding="utf-8"))
            outputs = None
            if meta.get("outputs"):
                outputs = load_outputs(entry / "outputs.npz")
        except (OSError, ValueError, KeyError, AgentError):
            return None  # missing or damaged: a miss, never trusted
        return Cached(doc=doc, outputs=outputs, measured_at=meta["measured_at"], key=key)

    def put(self, key: str, doc: dict, outputs: Any) -> None:
        entry = self._entry(key)
        tmp = None
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}.", dir=entry.parent))
            (tmp / "doc.json").write_text(json.dumps(doc), encoding="utf-8")
            if outputs is not None:
                save_outputs(tmp / "outputs.npz", outputs)
            now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "measured_at": now,
                                                       "outputs": outputs is not None}), encoding="utf-8")
            if entry.exists():
                shutil.rmtree(entry)  # a --remeasure replaces the old entry
            os.replace(tmp, entry)
        except OSError:
            pass  # a cache that cannot be written only costs a re-measure next time
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


class DeviceMeasurements:
    """The pipeline's handle: measures a request on the device, or reuses a cached result.

    The device is probed once (runtime versions, identity) to build keys, and by the search to tell which
    runtimes it has (``DeviceSession.lacking_runtime``); a recipe deploy with the cache off does not probe it. ``info[variant]`` says whether each variant's numbers were reused."""

    def __init__(self, deployer, *, device_name: str | None, cache: MeasureCache | None, remeasure: bool = False):
        self.deployer = deployer
        self.device_name = device_name
        self.cache = cache
        self.remeasure = remeasure
        self.info: dict[str, dict] = {}
        self._probe: dict | None = None
        self._agent_sha: str | None = None

    def probe_doc(self) -> dict:
        """The device's ``--probe`` (runtime versions, identity), run once per session."""
        if self._probe is None:
            t = self.deployer.t
            res = t.run([t.python, self.deployer.agent, "--probe"], timeout=self.deployer.timeout)
            doc = parse_agent_stdout(res.stdout, res.stderr, res.returncode)
            if not doc.get("ok"):
                raise AgentError(f"probing the device failed: {doc.get('error')}")
            self._probe = doc
        return self._probe

    def key(self, request) -> str:
        probe = self.probe_doc()
        runtime_version = (probe.get("runtimes") or {}).get(request.runtime)
        identity = device_identity(probe, self.device_name, self.deployer.t.kind)
        if self._agent_sha is None:  # hashed once per session, not per measurement
            self._agent_sha = sha256_file(agent_source())
        agent = {"version": probe.get("agent_version"), "sha256": self._agent_sha}
        return measurement_key(request, runtime_version=runtime_version, identity=identity, agent=agent)

    def measure(self, request: AgentRequest, run: Callable[[], AgentResult]) -> AgentResult:
        """``run()`` unless a valid cached result exists."""

        name = request.variant
        if self.cache is None:
            self.info[name] = {"reused": False, "cache": "off"}
            return run()
        key = self.key(request)
        hit = None if self.remeasure else self.cache.get(key)
        if hit is not None:
            self.info[name] = {"reused": True, "measured_at": hit.measured_at, "cache_key": key[:16]}
            return AgentResult(variant=name, doc={**hit.doc, "variant": name}, outputs=hit.outputs)
        res = run()
        share = (res.doc.get("device_state") or {}).get("other_cpu_fraction")
        if isinstance(share, (int, float)) and share > BUSY_OTHER_CPU:
            self.info[name] = {"reused": False, "cache": f"not stored: measured on a busy device (other processes "
                               f"used {share:.0%} of its CPU)"}
            return res
        self.cache.put(key, res.doc, res.outputs)
        self.info[name] = {"reused": False, "cache_key": key[:16], **({"remeasured": True} if self.remeasure else {})}
        return res

    def warning(self) -> str | None:
        reused = [f"{n} (measured {i['measured_at']})" for n, i in self.info.items() if i.get("reused")]
        if not reused:
            return None
        return ("numbers reused from the measurement cache for " + ", ".join(reused)
                + "; pass --remeasure to measure again")


def open_device_measurements(deployer, *, device_name: str | None, remeasure: bool = False,
                             max_age_s: float | None = None) -> DeviceMeasurements:
    cache = None if measure_cache_disabled() else MeasureCache(max_age_s=max_age_s or DEFAULT_MAX_AGE_S)
    return DeviceMeasurements(deployer, device_name=device_name, cache=cache, remeasure=remeasure)
