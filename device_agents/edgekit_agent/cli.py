"""The agent's command line: one JSON document on stdout, logs on stderr.

    python3 edgekit_agent.pyz REQUEST.json      # measure one model variant (or an A/B pair)
    python3 edgekit_agent.pyz --probe           # what this device is and can run
    python3 edgekit_agent.pyz --sha256 FILE...  # hashes of files (content-addressed delivery)
    python3 edgekit_agent.pyz --version

Exit codes: 0 ok, 2 bad request or data, 4 runtime missing or model failed to load/run. The request path
imports numpy (through ``measure``) only when a request is run: ``--probe``, ``--sha256`` and ``--version``
work on a device that has nothing but Python."""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from .device import device_facts, device_state
from .hashing import sha256
from .protocol import AGENT_VERSION, EXIT_BAD_REQUEST, PROTOCOL, AgentFailure, Doc
from .runners import available_runtimes, load_plugins

USAGE = "usage: edgekit_agent.pyz REQUEST.json | --probe | --sha256 FILE... | --version"


def probe() -> Doc:
    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "device": device_facts(),
        "device_state": device_state(),
        "runtimes": available_runtimes(),
    }


def read_request(path: str) -> Doc:
    try:
        with open(path, encoding="utf-8") as fh:
            req = json.load(fh)
    except (OSError, ValueError) as exc:
        raise AgentFailure("bad_request", f"cannot read request {path}: {exc}", EXIT_BAD_REQUEST) from exc
    if not isinstance(req, dict):
        raise AgentFailure("bad_request", f"request {path} is not a JSON object", EXIT_BAD_REQUEST)
    if req.get("protocol") != PROTOCOL:
        raise AgentFailure(
            "bad_request", f"request protocol {req.get('protocol')} != agent protocol {PROTOCOL}", EXIT_BAD_REQUEST
        )
    return req


def run_request(req: Doc) -> Doc:
    """A request's answer: a generation workload, an A/B pair, or one measurement."""
    from .measure import measure, measure_ab  # numpy: only on the request path

    if req.get("generate"):
        from .generation import generate

        return generate(req)
    return measure_ab(req) if req.get("ab") else measure(req)


def main(argv: Sequence[str]) -> int:
    try:
        if len(argv) == 2 and argv[1] == "--probe":
            load_plugins()
            doc = probe()
        elif len(argv) >= 2 and argv[1] == "--sha256":
            doc = {
                "protocol": PROTOCOL,
                "ok": True,
                "sha256": {p: (sha256(p) if os.path.isfile(p) else None) for p in argv[2:]},
            }
        elif len(argv) == 2 and argv[1] == "--version":
            doc = {"protocol": PROTOCOL, "agent_version": AGENT_VERSION, "ok": True}
        elif len(argv) == 2:
            req = read_request(argv[1])
            load_plugins()
            doc = run_request(req)
        else:
            raise AgentFailure("usage", USAGE, EXIT_BAD_REQUEST)
    except AgentFailure as exc:
        print(
            json.dumps(
                {
                    "protocol": PROTOCOL,
                    "agent_version": AGENT_VERSION,
                    "ok": False,
                    "error": {"kind": exc.kind, "message": exc.message},
                }
            )
        )
        return exc.exit_code
    print(json.dumps(doc))
    return 0


def entry() -> None:
    sys.exit(main(sys.argv))
