"""Train DigitsCNN on scikit-learn's bundled 8x8 digits (no download) and write:

    OUT/model.pt2    torch.export program (what `edgekit deploy` takes)
    OUT/model.pth    plain state dict (for --arch examples/digits/model.py:DigitsCNN)
    OUT/eval.npz     held-out inputs x (N,1,8,8 float32) and labels y
    OUT/calib.npz    calibration inputs x (from the training split)
    OUT/train.npz    the training split (for pruning fine-tunes and distillation)

Usage: python examples/digits/train.py [--out examples/digits/artifacts] [--epochs 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import DigitsCNN  # noqa: E402


def load_data(seed: int = 0):
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def train(epochs: int = 30, seed: int = 0, width: int = 16):
    torch.manual_seed(seed)
    xtr, xte, ytr, yte = load_data(seed)
    model = DigitsCNN(width)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean() * 100
    return model, (xtr, xte, ytr, yte), float(acc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "artifacts")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model, (xtr, xte, ytr, yte), acc = train(args.epochs, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    ep = torch.export.export(model, (torch.from_numpy(xte[:1]),))
    torch.export.save(ep, str(args.out / "model.pt2"))
    torch.save(model.state_dict(), args.out / "model.pth")
    np.savez(args.out / "eval.npz", x=xte, y=yte)
    np.savez(args.out / "calib.npz", x=xtr[:256])
    np.savez(args.out / "train.npz", x=xtr, y=ytr)
    print(f"trained DigitsCNN: test accuracy {acc:.2f}% on {len(yte)} held-out digits; wrote {args.out}")


if __name__ == "__main__":
    main()
