"""Shared by the DDP tests: the digits training split written as .npz (no training needed), and a
factory module with tiny DigitsCNN variants (width 8)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
EDGEKIT = str(Path(sys.executable).with_name("edgekit"))

FACTORIES = f'''
import os, sys
sys.path.insert(0, {str(DIGITS)!r})
import torch
from model import DigitsCNN


def small():
    return DigitsCNN(8)


def nobn():
    # BatchNorm without SyncBatchNorm (CPU) normalises per process; without it 1 and N processes
    # compute the same function, which is what the equivalence test checks
    m = DigitsCNN(8)
    for seq in (m.features,):
        for i, mod in enumerate(seq):
            if isinstance(mod, torch.nn.BatchNorm2d):
                seq[i] = torch.nn.Identity()
    return m


def five_classes():
    m = DigitsCNN(8)
    m.head[-1] = torch.nn.Linear(64, 5)
    return m


class _Dies(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nobn()
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if os.environ.get("RANK") == "1" and self.calls == 4:
                os._exit(13)  # a rank that dies mid-run, as an OOM kill or a crash would
        return self.inner(x)


def dies_on_rank1():
    return _Dies()


class _DiesOnce(_Dies):
    def forward(self, x):
        marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "died-once.marker")
        if self.training and os.environ.get("RANK") == "1" and not os.path.exists(marker):
            self.calls += 1
            if self.calls == 6:  # after the checkpoint at step 2 (--checkpoint-every 2)
                open(marker, "w").close()
                os._exit(13)
        return self.inner(x)


def dies_once_on_rank1():
    return _DiesOnce()
'''


def write_digits(dest: Path) -> tuple[Path, Path]:
    import train as digits_train  # examples/digits/train.py (pyproject.toml: pytest's pythonpath)

    xtr, xte, ytr, yte = digits_train.load_data(0)
    dest.mkdir(parents=True, exist_ok=True)
    np.savez(dest / "train.npz", x=xtr, y=ytr)
    np.savez(dest / "eval.npz", x=xte, y=yte)
    return dest / "train.npz", dest / "eval.npz"


def write_factories(dest: Path) -> Path:
    p = dest / "factories.py"
    p.write_text(FACTORIES)
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_dict(pt2: Path) -> dict:
    import torch

    return {k: v.detach().clone() for k, v in torch.export.load(str(pt2)).state_dict.items()}


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def run(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([EDGEKIT, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def popen(*args) -> subprocess.Popen:
    # a session of its own, so the test can kill edgekit, torchrun and its workers together
    return subprocess.Popen([EDGEKIT, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def kill_group(proc: subprocess.Popen) -> list[int]:
    """SIGKILL edgekit and torchrun (its process group), as a crashed job would. torchrun puts each
    worker in a session of its own; the workers must die with their agent (PR_SET_PDEATHSIG).
    Returns the PIDs of workers that outlived it (killed here so the test leaves nothing behind)."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs(tree, timeout=30)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in alive]
