"""The agent's side of the protocol: its version, exit codes, the failure every module raises, logging.

A request is one JSON document (``edgekit/agent/protocol.py`` on the host builds it); the agent prints
exactly one JSON document on stdout and logs on stderr."""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterable

AGENT_VERSION = "0.2.0"
PROTOCOL = 2  # 2: every output comes back (an .npz); the host scores them

EXIT_BAD_REQUEST = 2
EXIT_RUNTIME = 4

#: a request or a document as JSON gives it (the host's pydantic models are the typed contract)
Doc = Dict[str, Any]


class AgentFailure(Exception):
    """A failure the agent answers with ``ok: false`` and ``error: {kind, message}``: ``kind`` is what the
    host's ``VARIANT_FAULTS`` reads (bad_request, bad_data, integrity, runtime_missing, model_load_failed,
    inference_failed, ...), ``exit_code`` the process's exit status."""

    def __init__(self, kind: str, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exit_code = exit_code


def first_line(text: object, limit: int = 300, prefer: Iterable[str] = ()) -> str:
    """The first non-empty line of a runtime's message, or the first that names one of ``prefer``
    (LiteRT puts the failing node after lines about its internals)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    telling = [ln for ln in lines if any(w in ln.lower() for w in prefer)]
    return ((telling or lines or [""])[0])[:limit]


def log(msg: str) -> None:
    print(f"[edgekit-agent] {msg}", file=sys.stderr, flush=True)
