"""The zoo's builders: transformers' own model classes at tiny configs (random init from the
config, never a download), wrapped so forward takes plain tensors named like the library's inputs
and returns a tuple, trained briefly on the seeded tasks in data.py, exported with torch.export.

Each Spec says what its wrapper takes and returns; build(spec, out_dir) writes model.pt2,
eval.npz, calib.npz, train.npz and zoo.json into out_dir."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from . import data, metrics  # noqa: E402


class LogitsOnly(nn.Module):
    """(model(**inputs).logits,) for a transformers model; forward's parameters are the input
    names, so torch.export names the graph inputs after them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class ImageClassifier(LogitsOnly):
    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(pixel_values=pixel_values).logits,)


class TextClassifier(LogitsOnly):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_ids=input_ids, attention_mask=attention_mask).logits,)


class AudioClassifier(LogitsOnly):
    def forward(self, input_values: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_values=input_values).logits,)


class GridDetector(nn.Module):
    """A transformers ResNetModel backbone (stride 8 -> an 8x8 grid at 64x64) and a single-shot
    head written here: each cell predicts C+1 class logits (last = no object) and one box,
    cx = (col + sigmoid(tx)) / G, cy = (row + sigmoid(ty)) / G, w = sigmoid(tw), h = sigmoid(th),
    so boxes lie in [0, 1]. Queries are the cells in row-major order."""

    def __init__(self, backbone: nn.Module, channels: int, classes: int, grid: int):
        super().__init__()
        self.backbone, self.classes, self.grid = backbone, classes, grid
        self.head = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(channels, classes + 1 + 4, 1))
        rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
        self.register_buffer("offsets", torch.stack([cols, rows], -1).reshape(1, grid * grid, 2).float(),
                             persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = self.backbone(pixel_values=pixel_values).last_hidden_state
        out = self.head(feat)  # (N, C+5, G, G)
        n = out.shape[0]
        out = out.permute(0, 2, 3, 1).reshape(n, self.grid * self.grid, self.classes + 5)
        logits = out[..., : self.classes + 1]
        t = torch.sigmoid(out[..., self.classes + 1:])
        centre = (self.offsets + t[..., :2]) / self.grid
        return logits, torch.cat([centre, t[..., 2:]], -1)


# ---- losses: (outputs tuple, y tensor) -> scalar ----

def _ce(out, y):
    return F.cross_entropy(out[0], y)


def _seg_loss(out, y):
    return F.cross_entropy(out[0], y)


def _det_targets(y: torch.Tensor, grid: int, classes: int):
    """Per-cell targets: the cell holding a box centre gets its class and box; others no-object."""
    n = y.shape[0]
    cls_t = torch.full((n, grid * grid), classes, dtype=torch.long)
    box_t = torch.zeros(n, grid * grid, 4)
    valid = y[..., 0] >= 0
    b, m = torch.nonzero(valid, as_tuple=True)
    col = (y[b, m, 1] * grid).long().clamp(0, grid - 1)
    row = (y[b, m, 2] * grid).long().clamp(0, grid - 1)
    cell = row * grid + col
    cls_t[b, cell] = y[b, m, 0].long()
    box_t[b, cell] = y[b, m, 1:5]
    return cls_t, box_t


def _det_loss(out, y, grid=8, classes=data.DET_CLASSES):
    logits, boxes = out
    cls_t, box_t = _det_targets(y, grid, classes)
    weight = torch.ones(classes + 1)
    weight[classes] = 0.1  # ~2 objects among 64 cells
    loss = F.cross_entropy(logits.reshape(-1, classes + 1), cls_t.reshape(-1), weight=weight)
    pos = cls_t < classes
    if pos.any():
        loss = loss + 5.0 * F.l1_loss(boxes[pos], box_t[pos])
    return loss


# ---- the models ----

def _mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    cfg = dict(image_size=64, depth_multiplier=0.35, finegrained_output=False, classifier_dropout_prob=0.1,
               num_labels=4)
    return ImageClassifier(MobileNetV2ForImageClassification(MobileNetV2Config(**cfg))), cfg


def _levit():
    # MobileViT (the first choice) did not learn here: 3 tiny configs (0.3-0.8 M params) x lr 2e-3..6e-3
    # x 200-300 steps all stalled at loss ln 2 with 2 of 4 colour classes merged; LeViT learns in seconds.
    from transformers import LevitConfig, LevitForImageClassification
    cfg = dict(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
               key_dim=[8, 8, 8], num_labels=4)
    return ImageClassifier(LevitForImageClassification(LevitConfig(**cfg))), cfg


def _bert():
    from transformers import BertConfig, BertForSequenceClassification
    cfg = dict(vocab_size=data.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=data.SEQ, type_vocab_size=1,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=data.PAD, num_labels=2)
    return TextClassifier(BertForSequenceClassification(BertConfig(**cfg))), cfg


def _wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification
    cfg = dict(vocab_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               conv_dim=[32, 32, 32], conv_stride=[5, 2, 2], conv_kernel=[10, 3, 3], feat_extract_norm="group",
               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, classifier_proj_size=32,
               hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
               final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, mask_feature_prob=0.0, num_labels=4)
    return AudioClassifier(Wav2Vec2ForSequenceClassification(Wav2Vec2Config(**cfg))), cfg


def _segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    cfg = dict(num_encoder_blocks=4, depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64],
               num_attention_heads=[1, 1, 2, 2], sr_ratios=[8, 4, 2, 1], mlp_ratios=[2, 2, 2, 2],
               decoder_hidden_size=32, drop_path_rate=0.0, classifier_dropout_prob=0.0, num_labels=3)
    return ImageClassifier(SegformerForSemanticSegmentation(SegformerConfig(**cfg))), cfg


def _resnet_grid_detector():
    from transformers import ResNetConfig, ResNetModel
    cfg = dict(embedding_size=16, hidden_sizes=[24, 48], depths=[1, 1], layer_type="basic")
    return GridDetector(ResNetModel(ResNetConfig(**cfg)), channels=48, classes=data.DET_CLASSES, grid=8), \
        {**cfg, "head": "conv3x3(48)+ReLU+conv1x1(3+1+4) per cell of the 8x8 grid"}


@dataclass(frozen=True)
class Spec:
    name: str
    library_class: str
    make: Callable[[], tuple[nn.Module, dict]]
    task: str
    generate: Callable[[np.random.Generator, int], tuple[dict[str, np.ndarray], np.ndarray]]
    loss: Callable
    metric: str
    chance: float  # the metric of a model that ignores its input (see the test for each bound)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: int = 300
    batch: int = 32
    lr: float = 2e-3
    sizes: dict = field(default_factory=lambda: {"train": 256, "calib": 64, "eval": 160})


SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("cnn", "transformers.MobileNetV2ForImageClassification", _mobilenet_v2,
         "which quarter of the hue circle the colour of one 8-20 px square falls in (noisy grey 64x64)",
         data.hue_square, _ce, "top1", 0.25, ("pixel_values",), ("logits",), steps=200, batch=16),
    Spec("hybrid", "transformers.LevitForImageClassification", _levit,
         "which quarter of the hue circle the colour of one 8-20 px square falls in (noisy grey 64x64)",
         data.hue_square, _ce, "top1", 0.25, ("pixel_values",), ("logits",), steps=500, batch=16, lr=3e-3),
    Spec("text", "transformers.BertForSequenceClassification", _bert,
         "1 iff token 7 occurs among the unpadded tokens (length 4-16, right-padded with 0 to 16)",
         data.token_presence, _ce, "top1", 0.5, ("input_ids", "attention_mask"), ("logits",), steps=400),
    Spec("audio", "transformers.Wav2Vec2ForSequenceClassification", _wav2vec2,
         "frequency band (300-700/700-1100/1100-1500/1500-1900 Hz) of a noisy 0.5 s tone at 8 kHz",
         data.tone_band, _ce, "top1", 0.25, ("input_values",), ("logits",), steps=200),
    Spec("seg", "transformers.SegformerForSemanticSegmentation", _segformer,
         "per-pixel background / red rectangle / blue rectangle, labels at the logits' 16x16",
         data.rectangles_seg, _seg_loss, "miou", 0.3, ("pixel_values",), ("logits",), steps=300),
    Spec("det", "transformers.ResNetModel + zoo GridDetector head", _resnet_grid_detector,
         "1-3 red/green/blue squares (10-20 px) per 64x64 image: class by colour and box",
         data.coloured_boxes, _det_loss, "map50", 0.0, ("pixel_values",), ("logits", "boxes"), steps=300, batch=16),
]}

SEEDS = {"train": 1, "calib": 2, "eval": 3, "example": 4}


def _threads() -> int:
    return int(os.environ.get("EDGEKIT_ZOO_THREADS", "1"))


def _run(model: nn.Module, inputs: dict[str, np.ndarray], spec: Spec, batch: int = 64) -> tuple[np.ndarray, ...]:
    outs = []
    with torch.no_grad():
        for i in range(0, len(inputs[spec.inputs[0]]), batch):
            outs.append(model(*(torch.from_numpy(inputs[k][i:i + batch]) for k in spec.inputs)))
    return tuple(np.concatenate([o[j].numpy() for o in outs]) for j in range(len(outs[0])))


def score(spec: Spec, outputs: tuple[np.ndarray, ...], y: np.ndarray) -> float:
    return metrics.METRICS[spec.metric](outputs, y)


def build(spec: Spec, out_dir: Path) -> dict:
    """Train spec's model and write its files into out_dir (which must exist); return zoo.json."""
    old_threads = torch.get_num_threads()
    torch.set_num_threads(_threads())
    try:
        return _build(spec, out_dir)
    finally:
        torch.set_num_threads(old_threads)


def _build(spec: Spec, out_dir: Path) -> dict:
    import transformers

    torch.manual_seed(0)
    model, config = spec.make()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.lr, total_steps=spec.steps, pct_start=0.15)
    rng = np.random.default_rng(SEEDS["train"] * 1000 + 17)  # fresh samples every step
    model.train()
    t0 = time.perf_counter()
    losses = []
    for _ in range(spec.steps):
        x, y = spec.generate(rng, spec.batch)
        loss = spec.loss(model(*(torch.from_numpy(x[k]) for k in spec.inputs)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    train_s = time.perf_counter() - t0
    model.eval()

    sets = {role: spec.generate(np.random.default_rng(SEEDS[role]), n) for role, n in spec.sizes.items()}
    for role, (x, y) in sets.items():
        np.savez(out_dir / f"{role}.npz", **x, y=y)
    ev_x, ev_y = sets["eval"]
    value = score(spec, _run(model, ev_x, spec), ev_y)

    ex_x, _ = spec.generate(np.random.default_rng(SEEDS["example"]), 1)
    example = tuple(torch.from_numpy(ex_x[k]) for k in spec.inputs)
    t1 = time.perf_counter()
    ep = torch.export.export(model, example)
    torch.export.save(ep, str(out_dir / "model.pt2"))
    export_s = time.perf_counter() - t1

    with torch.no_grad():
        eager = model(*example)
    facts = {
        "name": spec.name,
        "library": "transformers",
        "library_version": transformers.__version__,
        "torch_version": torch.__version__,
        "class": spec.library_class,
        "wrapper": f"tests.zoo.builders.{type(model).__name__}",
        "config": config,
        "params": params,
        "task": spec.task,
        "inputs": [{"name": k, "dtype": str(ex_x[k].dtype), "shape": list(ex_x[k].shape)} for k in spec.inputs],
        "outputs": [{"name": n, "shape": list(o.shape)} for n, o in zip(spec.outputs, eager)],
        "labels": {"key": "y", "dtype": str(ev_y.dtype), "shape_eval": list(ev_y.shape)},
        "samples": {role: int(len(y)) for role, (_, y) in sets.items()},
        "metric": spec.metric,
        "metric_fp32": value,
        "chance": spec.chance,
        "train_steps": spec.steps,
        "train_batch": spec.batch,
        "train_seconds": round(train_s, 2),
        "train_loss_first_last": [round(float(np.mean(losses[:10])), 4), round(float(np.mean(losses[-10:])), 4)],
        "export_seconds": round(export_s, 2),
        "threads": _threads(),
    }
    (out_dir / "zoo.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts
