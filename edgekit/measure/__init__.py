"""Statistics over raw on-device timings (computed on the host, never on the device)."""

from .stats import LatencyStats, latency_stats

__all__ = ["LatencyStats", "latency_stats"]
