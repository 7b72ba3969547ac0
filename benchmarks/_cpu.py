"""The CPU facts every benchmark prints beside its figures: x86 INT8 gains hinge on VNNI, and the
machines these run on differ from one session to the next (AVX2-only or AVX-512 with VNNI)."""

from __future__ import annotations

from pathlib import Path

# bf16: what OpenVINO's CPU plugin runs float models in by default where the CPU has it
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16", "amx_bf16")


def isa() -> str:
    """``"<model name>; avx2 avx512f avx512_vnni"`` from /proc/cpuinfo (or why it is unknown)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = set(next(ln for ln in lines if ln.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration, IndexError):
        return "unknown (no /proc/cpuinfo)"
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    return f"{model}; {' '.join(f for f in FLAGS if f in flags) or 'no avx2'}"
