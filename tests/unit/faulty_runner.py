"""A faulty onnxruntime runner, registered in the device agent through its plug-in point
(``EDGEKIT_AGENT_PLUGINS=this file``, read by the local agent subprocess; never forwarded over SSH or adb).

It replaces the agent's onnxruntime runner for that process: a request whose runtime options and
``threads`` match ``EDGEKIT_TEST_HANG_ON`` / ``EDGEKIT_TEST_KILL_ON`` ("key=value[,key=value]") hangs, or is
killed by SIGKILL, when the runner loads the model, as a runtime stuck or crashing on one setting would;
every other request runs on the real onnxruntime runner. This file runs inside the agent, not in pytest."""

from __future__ import annotations

import os
import signal
import time

from edgekit_agent.runners import OnnxRunner, register

HANG_ON, KILL_ON = "EDGEKIT_TEST_HANG_ON", "EDGEKIT_TEST_KILL_ON"


def _matches(spec: str | None, request: dict) -> bool:
    if not spec:
        return False
    have = {k: str(v) for k, v in (request.get("runtime_options") or {}).items()}
    have["threads"] = str(request.get("threads", 1))
    return all(have.get(k) == v for k, _, v in (p.partition("=") for p in spec.split(",")))


@register
class FaultyOnnxRunner(OnnxRunner):
    name = "onnxruntime"

    def load(self, model_path: str, request: dict) -> None:
        if _matches(os.environ.get(HANG_ON), request):
            time.sleep(3600)
        if _matches(os.environ.get(KILL_ON), request):
            os.kill(os.getpid(), signal.SIGKILL)
        super().load(model_path, request)
