"""Content-addressed delivery of the bundle (agent, models, data, requests) to a device.

Every file lands as ``files/<sha256><suffix>``: a file already on the device with that hash is not
sent again, and every pushed file is hashed on the device before it is used. Transports write to
a temp name and rename, so an interrupted push never leaves a file under its final name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AgentError, TransportError
from ..fsutil import sha256_file
from ..transport.base import Transport
from .package import agent_pyz


def agent_source() -> Path:
    """The device agent as one file: the deterministic zipapp built from device_agents/edgekit_agent/."""
    return agent_pyz()


@dataclass
class DeliveryStats:
    files_sent: int = 0
    files_reused: int = 0
    bytes_sent: int = 0
    #: files sent per kind (agent, eval, model, request, wheel): a warm re-deploy re-sends no eval data, though
    #: a request or a rebuilt model may differ from last time
    sent_by_kind: dict[str, int] = field(default_factory=dict)

    def sent(self, kind: str, n_bytes: int) -> None:
        self.files_sent += 1
        self.bytes_sent += n_bytes
        self.sent_by_kind[kind] = self.sent_by_kind.get(kind, 0) + 1


class BundleDeployer:
    """Pushes files by content; remembers what is verified on the device in this session."""

    def __init__(self, transport: Transport, timeout: float = 120.0):
        self.t = transport
        self.timeout = timeout
        self.stats = DeliveryStats()
        self._agent_remote: str | None = None

    @property
    def agent(self) -> str:
        if self._agent_remote is None:
            self._agent_remote = self._install_agent()
        return self._agent_remote

    def _install_agent(self) -> str:
        """The agent lands by content like every other file, and is hashed on the device by itself
        (``--sha256`` of its own path) before use: a copy that still parses but was altered is
        replaced, never run."""
        src = agent_source()
        digest = sha256_file(src)
        remote = self.t.remote_path(f"agent/edgekit_agent-{digest[:16]}.pyz")
        if self._self_hash(remote) == digest:
            self.stats.files_reused += 1
            return remote
        self.t.push(src, remote)
        self.stats.sent("agent", src.stat().st_size)
        got = self._self_hash(remote, strict=True)
        if got != digest:
            raise TransportError(f"the agent arrived corrupted on the device (sha256 {str(got)[:12]}... != "
                                 f"{digest[:12]}...)", hint="the link or the device's storage corrupts data; retry")
        return remote

    def _self_hash(self, remote: str, strict: bool = False) -> str | None:
        res = self.t.run([self.t.python, remote, "--sha256", remote], timeout=self.timeout)
        try:
            return json.loads(res.stdout)["sha256"][remote]
        except (ValueError, KeyError, TypeError):
            if not strict:
                return None  # missing or broken: (re)send it
        raise AgentError(
            f"the agent does not start on the device with '{self.t.python}' (exit {res.returncode}): "
            f"{(res.stderr or res.stdout).strip()[-400:]}",
            hint="the device needs Python 3.9+; set the device's python command in the inventory")

    def remote_hashes(self, remotes: list[str]) -> dict[str, str | None]:
        res = self.t.run([self.t.python, self.agent, "--sha256", *remotes], timeout=self.timeout)
        if not res.ok:
            raise AgentError(f"hashing files on the device failed: {(res.stderr or res.stdout).strip()[-400:]}")
        try:
            doc = json.loads(res.stdout)
            return doc["sha256"]
        except (ValueError, KeyError) as exc:
            raise AgentError(f"the agent's --sha256 answer is not valid JSON: {res.stdout[:200]!r}") from exc

    def deliver(self, files: list[Path], kind: str = "model") -> dict[Path, str]:
        """Make each local file present and verified on the device; return local -> remote path.
        ``kind`` names what the files are in the delivery counts."""
        want = {}
        for f in files:
            digest = sha256_file(f)
            suffix = "".join(Path(f).suffixes[-1:])
            want[Path(f)] = (digest, self.t.remote_path(f"files/{digest}{suffix}"))
        have = self.remote_hashes([r for _, r in want.values()])
        for local, (digest, remote) in want.items():
            if have.get(remote) == digest:
                self.stats.files_reused += 1
                continue
            self.t.push(local, remote)
            self.stats.sent(kind, local.stat().st_size)
        pushed = [r for local, (d, r) in want.items() if have.get(r) != d]
        if pushed:
            after = self.remote_hashes(pushed)
            for local, (digest, remote) in want.items():
                if remote in after and after[remote] != digest:
                    raise TransportError(
                        f"{local.name} arrived corrupted on the device (sha256 {str(after[remote])[:12]}... "
                        f"!= {digest[:12]}...)", hint="the link or the device's storage corrupts data; retry, "
                        "and check the device's disk")
        return {local: remote for local, (_, remote) in want.items()}
