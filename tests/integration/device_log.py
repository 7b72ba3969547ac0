"""Double bookings checked ON the device: a wrapper for the device's python that logs the busy interval
of every measuring agent run, and the count of overlapping intervals in that log."""

from __future__ import annotations

import textwrap
from pathlib import Path

# format with py= (the real interpreter) and log= (the log file on the device)
AGENT_LOGGER = textwrap.dedent("""
    # the device's python for this test: logs the busy interval of every measuring agent run ON the device
    import subprocess, sys, time
    args = sys.argv[1:]
    measuring = any("/edgekit_agent" in a for a in args) and not any(a.startswith("-") for a in args)
    s = time.time()
    rc = subprocess.call([{py!r}, *args])
    if measuring:
        with open({log!r}, "a") as f:
            f.write("%r %r\\n" % (s, time.time()))
    sys.exit(rc)
""")


def overlaps(log: Path) -> tuple[int, int]:
    """(intervals logged, intervals that began before the previous one ended)."""
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines() if line.strip())
    return len(spans), sum(1 for (_, e0), (s1, _) in zip(spans, spans[1:]) if s1 < e0)
