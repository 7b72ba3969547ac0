"""CI: the emulated arm64 twins' cold inputs, built while the lint and docs steps run (.ci/run starts this in the
background and waits for it before the default step), so the slow and ExecuTorch steps find them cached.

- the Debian bookworm arm64 rootfs (``edgekit.devices.sim_arm64.ensure_rootfs``: debootstrap, its second stage
  under qemu), at the path the twin tests use (``~/.cache/edgekit/rootfs``);
- the aarch64 wheelhouses the twin tests provision from (``tests/integration/test_arm64_twin.py: started_twin``
  and its ``twin`` fixture), at ``~/.cache/edgekit/wheelhouse/TARGET-py3.11``: the Pi 4's and the Pi 5's base
  wheels with OpenVINO and NCNN, and the Pi 5's ExecuTorch wheels (torch and executorch for aarch64, ~214 MB).

Each is cached by content (the rootfs by its version, a wheelhouse by the wheels it lacks): on a machine that ran
CI before this is a few file checks. Every test builds whatever is still missing itself, so a failure here costs
time, not correctness; it is printed and the exit status says so.

    .venv/bin/python .ci/prewarm_arm64.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CACHE = Path(os.path.expanduser("~/.cache/edgekit"))  # where tests/integration/test_arm64_twin.py looks
# (target, runtimes) as the twin tests provision them: test_arm64_twin's twin (rpi4, base wheels),
# test_openvino_ncnn_arm64 (rpi4 and rpi5 with openvino and ncnn), test_executorch_arm64 (rpi5 with executorch);
# llama.cpp's wheel for the Pi 5 is cross-built on the host by the llama.cpp background build instead
WHEELHOUSES = [("rpi4", ["openvino", "ncnn"]), ("rpi5", ["openvino", "ncnn"]), ("rpi5", ["executorch"])]


def main() -> int:
    os.environ.setdefault("EDGEKIT_ROOTFS_CACHE", str(CACHE / "rootfs"))
    from edgekit.devices import sim_arm64
    from edgekit.devices.provision import build_wheelhouse, wheelhouse_lacks
    from edgekit.inputs.targets import load_target

    failed = 0
    t0 = time.perf_counter()
    try:
        r = sim_arm64.ensure_rootfs(print)
        print(f"prewarm: arm64 rootfs {'built' if r.built else 'cached'} in {time.perf_counter() - t0:.0f} s")
    except Exception as exc:  # noqa: BLE001 - the tests build it themselves; say why it failed here
        failed += 1
        print(f"prewarm: arm64 rootfs failed ({type(exc).__name__}: {exc}); the twin tests build it", file=sys.stderr)
    for target, runtimes in WHEELHOUSES:
        t0 = time.perf_counter()
        spec = load_target(target)
        wh = CACHE / "wheelhouse" / f"{target}-py3.11"
        try:
            if wheelhouse_lacks(spec, wh, runtimes):
                build_wheelhouse(spec, wh, runtimes=runtimes)
                print(f"prewarm: {target} wheelhouse with {'+'.join(runtimes)} in {time.perf_counter() - t0:.0f} s")
            else:
                print(f"prewarm: {target} wheelhouse with {'+'.join(runtimes)} cached")
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"prewarm: {target} wheelhouse with {'+'.join(runtimes)} failed ({type(exc).__name__}: {exc}); "
                  "the twin tests download it", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
