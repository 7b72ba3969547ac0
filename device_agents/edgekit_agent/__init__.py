"""edgekit's on-device agent, a package shipped as one file.

It runs ON the device with Python 3.9 or newer and the runtime it drives (onnxruntime, LiteRT,
ExecuTorch, OpenVINO, NCNN; each brings numpy); it never imports edgekit. The host builds this package into
one deterministic zipapp (``edgekit/agent/package.py``: sorted entries, fixed timestamps, no compression,
byte-identical across builds), delivers it by content, checks its sha256 on the device, and runs the same
bytes in its own process (zipimport) for host-side checks.

Modules by role: ``protocol`` (version, exit codes, the failure), ``cli`` (the command line), ``measure``
(one measurement), ``timing`` (warm-up, timed runs, energy windows), ``evaluation`` (the eval pass),
``streams`` (constant and state inputs), ``tensors`` (layout, dtype, padding: the host imports it too),
``device`` (facts and state), ``memory``, ``energy``, ``hashing``, ``stats``, ``runners/`` (one module per
runtime, the registry). Importing the package imports no numpy and no runtime."""

from .protocol import AGENT_VERSION, EXIT_BAD_REQUEST, EXIT_RUNTIME, PROTOCOL, AgentFailure

__all__ = ["AGENT_VERSION", "PROTOCOL", "EXIT_BAD_REQUEST", "EXIT_RUNTIME", "AgentFailure"]
