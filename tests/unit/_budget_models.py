"""Models and data for the latency-budget tests (issue #46), imported by path as module:Class.

``PlantedNet``: a conv trunk that dominates the latency, and a planted group (the hidden layer of its small
head) whose pruning saves nothing measurable on the device. ``ResDW``: a residual block around a depthwise
conv (MobileNetV2-style), whose channels must be pruned together. ``quadrants``: a learnable synthetic task
(which quadrant of the image is brightest), so no data set is downloaded."""

import numpy as np
import torch
from torch import nn


class PlantedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


class ResDW(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.expand = nn.Sequential(nn.Conv2d(32, 64, 1), nn.BatchNorm2d(64), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, groups=64), nn.BatchNorm2d(64), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(64, 32, 1), nn.BatchNorm2d(32))
        self.fc = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = y + self.project(self.dw(self.expand(y)))  # the residual add ties stem's and project's channels
        return self.fc(y.mean((2, 3)))


class Single(nn.Module):
    """Nothing to prune: one linear layer, whose outputs are the classes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 16 * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def quadrants(n: int, seed: int, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 4, n)
    h = size // 2
    for i, q in enumerate(y):
        r, c = divmod(int(q), 2)
        x[i, :, r * h:(r + 1) * h, c * h:(c + 1) * h] += 1.5
    return x, y.astype(np.int64)


def trained(cls: type, out, epochs: int = 4, n: int = 1200) -> None:
    """Train ``cls`` briefly on the quadrants task; write model.pt2, train.npz, eval.npz, calib.npz to ``out``."""
    torch.manual_seed(0)
    model = cls()
    x, y = quadrants(n, 0)
    xe, ye = quadrants(300, 1)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for _ in range(epochs):
        model.train()
        perm = np.random.default_rng(0).permutation(n)
        for i in range(0, n, 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx])).backward()
            opt.step()
    model.eval()
    ep = torch.export.export(model, (torch.from_numpy(xe[:1]),))
    torch.export.save(ep, str(out / "model.pt2"))
    np.savez(out / "train.npz", x=x, y=y)
    np.savez(out / "eval.npz", x=xe, y=ye)
    np.savez(out / "calib.npz", x=x[:128])


class Wide(nn.Module):
    """Weights that dominate the process's peak memory (3.7M parameters, ~15 MB fp32): pruning its hidden widths
    frees memory the device can measure, unlike the tiny CNNs whose peak is the runtime's own."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 2048), nn.ReLU(), nn.Linear(2048, 1024),
                                  nn.ReLU(), nn.Linear(1024, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
