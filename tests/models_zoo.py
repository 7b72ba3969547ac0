"""Six tiny architectures that stress different ops in the converter chain (reusable by any test).

| name            | stresses                                                        | input        |
|-----------------|-----------------------------------------------------------------|--------------|
| mobilenet       | depthwise-separable convs, ReLU6, inverted residual, global pool | 1x3x16x16    |
| resnet          | residual adds, BatchNorm (folded), stride-2 conv                 | 1x3x16x16    |
| mlp             | Linear + ReLU (2-D input, no layout question)                    | 1x32         |
| transformer     | self-attention (matmul, softmax), LayerNorm, GELU                | 1x8x16       |
| gru             | a GRU over 8 time steps                                          | 1x8x12       |
| encoder_decoder | stride-2 conv down, nearest upsampling, skip concat, 4-D output  | 1x3x16x16    |

Weights are seeded (no training: parity compares a model with its own conversion). ``make_data``
labels the eval set with the fp32 model's own predictions, so "accuracy" in a deploy of these
models is agreement with the float model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn


class MobileNetTiny(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU6())
        self.expand = nn.Sequential(nn.Conv2d(8, 24, 1), nn.BatchNorm2d(24), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(24, 24, 3, padding=1, groups=24), nn.BatchNorm2d(24), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(24, 8, 1), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.project(self.dw(self.expand(x)))
        return self.head(x.mean(dim=(2, 3)))


class ResNetTiny(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        x = self.down(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class MLPTiny(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x):
        return self.net(x)


class TransformerTiny(nn.Module):
    """One pre-norm encoder block, written out so every op is plain: q/k/v projections, scaled
    dot-product softmax attention (2 heads), LayerNorm, GELU feed-forward, mean pooling."""

    def __init__(self, dim: int = 16, heads: int = 2, classes: int = 10):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):  # x: (1, T, dim)
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        x = x + self.ff(self.norm2(x))
        return self.head(x.mean(dim=1))


class GRUTiny(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.gru = nn.GRU(12, 16, batch_first=True)
        self.head = nn.Linear(16, classes)

    def forward(self, x):  # x: (1, 8, 12)
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class EncoderDecoderTiny(nn.Module):
    """A one-level U-Net: 4-class per-pixel logits at the input resolution."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec = nn.Sequential(nn.Conv2d(16 + 8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 1))

    def forward(self, x):
        skip = self.enc(x)
        y = self.up(self.down(skip))
        return self.dec(torch.cat([y, skip], dim=1))


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # batch 1 first
    stresses: str


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("mobilenet", MobileNetTiny, (1, 3, 16, 16), "depthwise-separable convs, ReLU6, inverted residual"),
    ZooModel("resnet", ResNetTiny, (1, 3, 16, 16), "residual adds, BatchNorm"),
    ZooModel("mlp", MLPTiny, (1, 32), "Linear + ReLU"),
    ZooModel("transformer", TransformerTiny, (1, 8, 16), "attention, softmax, LayerNorm, GELU"),
    ZooModel("gru", GRUTiny, (1, 8, 12), "GRU"),
    ZooModel("encoder_decoder", EncoderDecoderTiny, (1, 3, 16, 16), "upsampling, concat, 4-D output"),
]}


def make_model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = ZOO[name].build()
    # give BatchNorm non-trivial statistics so folding it is actually tested
    g = torch.Generator().manual_seed(seed + 1)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
    return m.eval()


def make_inputs(name: str, n: int, seed: int = 0) -> np.ndarray:
    shape = ZOO[name].input_shape[1:]
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def export(name: str, out_dir: Path, *, n_calib: int = 64, n_eval: int = 64) -> tuple[Path, Path, Path]:
    """Write ``NAME.pt2``, ``NAME-calib.npz`` (x) and ``NAME-eval.npz`` (x, y = the fp32 model's
    own predictions) into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = make_model(name)
    example = (torch.from_numpy(make_inputs(name, 1, seed=99)),)
    ep = torch.export.export(model, example)
    pt2 = out_dir / f"{name}.pt2"
    torch.export.save(ep, str(pt2))
    calib, ev = make_inputs(name, n_calib, seed=1), make_inputs(name, n_eval, seed=2)
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(ev[i:i + 1])) for i in range(len(ev))]).numpy()
    y = logits.reshape(len(logits), -1).argmax(1).astype(np.int64)
    np.savez(out_dir / f"{name}-calib.npz", x=calib)
    np.savez(out_dir / f"{name}-eval.npz", x=ev, y=y)
    return pt2, out_dir / f"{name}-calib.npz", out_dir / f"{name}-eval.npz"
