"""A test zoo of real architectures built from transformers' own code (tiny configs, random init,
trained here for seconds on seeded synthetic tasks, exported with torch.export).

    from tests import zoo
    m = zoo.get("det")          # builds on first use (cached, see cache.py), then instant
    m.pt2, m.eval, m.calib, m.train, m.facts["metric_fp32"]

| name   | transformers class                         | inputs                                  | outputs (in order)                 | metric |
|--------|--------------------------------------------|-----------------------------------------|------------------------------------|--------|
| cnn    | MobileNetV2ForImageClassification          | pixel_values f32 (1,3,64,64)            | logits (1,4)                       | top1   |
| hybrid | LevitForImageClassification                | pixel_values f32 (1,3,64,64)            | logits (1,4)                       | top1   |
| text   | BertForSequenceClassification              | input_ids, attention_mask i64 (1,16)    | logits (1,2)                       | top1   |
| audio  | Wav2Vec2ForSequenceClassification          | input_values f32 (1,4000)               | logits (1,4)                       | top1   |
| seg    | SegformerForSemanticSegmentation           | pixel_values f32 (1,3,64,64)            | logits (1,3,16,16)                 | miou   |
| det    | ResNetModel + a grid head (builders.py)    | pixel_values f32 (1,3,64,64)            | logits (1,64,4), boxes (1,64,4)    | map50  |

The .npz files hold the inputs under the forward parameters' names and the labels under ``y``:
int64 (N,) for classifiers, int64 (N,16,16) for seg (the logits' resolution), float32 (N,3,5) rows
[class, cx, cy, w, h] (normalised; class -1 = padding) for det, whose logits' last class is
"no object" and whose boxes are (cx, cy, w, h) in [0, 1] (DETR's convention).
The exported programs have a static batch of 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import cache

NAMES: tuple[str, ...] = ("cnn", "hybrid", "text", "audio", "seg", "det")


@dataclass(frozen=True)
class ZooModel:
    name: str
    dir: Path
    pt2: Path
    eval: Path
    calib: Path
    train: Path
    facts: dict  # zoo.json

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.facts["inputs"]]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.facts["outputs"]]

    @property
    def metric(self) -> str:
        return self.facts["metric"]


def _build(name: str, out_dir: Path) -> None:
    from . import builders

    builders.build(builders.SPECS[name], out_dir)


def get(name: str) -> ZooModel:
    """The zoo model ``name`` (one of NAMES), built into the cache on first use."""
    if name not in NAMES:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(NAMES)}")
    d = cache.ensure(name, lambda tmp: _build(name, tmp))
    facts = json.loads((d / "zoo.json").read_text())
    return ZooModel(name, d, d / "model.pt2", d / "eval.npz", d / "calib.npz", d / "train.npz", facts)
