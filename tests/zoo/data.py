"""Seeded synthetic tasks for the zoo: every generator takes a numpy Generator and a count and
returns (inputs, y), inputs a dict named exactly like the wrapper's forward parameters.

Images are float32 (N, 3, 64, 64), roughly in [-1, 1] ((v - 0.5) / 0.5 of a [0, 1] picture)."""

from __future__ import annotations

import numpy as np

IMAGE = 64
COLOURS = np.array([[0.9, 0.15, 0.15],   # red
                    [0.15, 0.85, 0.15],  # green
                    [0.15, 0.25, 0.95],  # blue
                    [0.9, 0.85, 0.1]],   # yellow
                   dtype=np.float32)


def _background(rng: np.random.Generator, n: int) -> np.ndarray:
    grey = rng.uniform(0.25, 0.55, size=(n, 1, 1, 1)).astype(np.float32)
    return grey + rng.normal(0.0, 0.08, size=(n, 3, IMAGE, IMAGE)).astype(np.float32)


def _normalise(img: np.ndarray) -> np.ndarray:
    return ((np.clip(img, 0.0, 1.0) - 0.5) / 0.5).astype(np.float32)


def _hue_to_rgb(h: np.ndarray, s: float = 0.85, v: float = 0.9) -> np.ndarray:
    """HSV -> RGB for hues h in [0, 1) (vectorised), shape (n, 3)."""
    k = (np.array([5.0, 3.0, 1.0])[None, :] + h[:, None] * 6.0) % 6.0
    return (v - v * s * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)).astype(np.float32)


def hue_square(rng: np.random.Generator, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """4 classes: which quarter of the hue circle the colour of one square (12-24 px, anywhere)
    falls in, on a noisy grey background. Hues are uniform, so squares near a quarter's border are
    genuinely ambiguous under the pixel noise: a well-trained model scores high but not 100%."""
    img = _background(rng, n)
    hue = rng.random(n)
    y = np.minimum((hue * 4).astype(np.int64), 3)
    rgb = _hue_to_rgb(hue)
    for i in range(n):
        s = int(rng.integers(12, 25))
        r, c = (int(v) for v in rng.integers(0, IMAGE - s + 1, size=2))
        img[i, :, r:r + s, c:c + s] = rgb[i][:, None, None] + rng.normal(0, 0.08, size=(3, s, s))
    return {"pixel_values": _normalise(img)}, y


VOCAB, SEQ, PAD, CLS, KEY = 100, 16, 0, 1, 7


def token_presence(rng: np.random.Generator, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Label 1 iff token KEY (7) occurs among the unpadded tokens. Sequences are [CLS] + 3..15
    random tokens from 2..99 (never KEY unless placed), right-padded with PAD (0) to 16 and
    attention_mask 0 there; half the samples get KEY at one or two random unpadded positions."""
    ids = np.full((n, SEQ), PAD, dtype=np.int64)
    mask = np.zeros((n, SEQ), dtype=np.int64)
    y = (rng.random(n) < 0.5).astype(np.int64)
    for i in range(n):
        length = int(rng.integers(4, SEQ + 1))  # including [CLS]
        body = rng.integers(2, VOCAB - 1, size=length - 1)
        body[body >= KEY] += 1  # skip KEY: draws land in 2..99 minus 7
        if y[i]:
            k = int(rng.integers(1, 3))
            body[rng.choice(length - 1, size=min(k, length - 1), replace=False)] = KEY
        ids[i, 0], ids[i, 1:length] = CLS, body
        mask[i, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}, y


SAMPLE_RATE, AUDIO_LEN = 8000, 4000
BANDS_HZ = ((300, 700), (700, 1100), (1100, 1500), (1500, 1900))  # contiguous: borders are ambiguous


def tone_band(rng: np.random.Generator, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """4 classes: which of 4 contiguous bands (BANDS_HZ) the frequency of a sine tone (0.5 s at 8 kHz, random phase,
    amplitude 0.3-1) falls in, with Gaussian noise (sd 0.3); each clip is normalised to zero mean,
    unit variance like Wav2Vec2FeatureExtractor(do_normalize=True)."""
    y = rng.integers(0, len(BANDS_HZ), size=n).astype(np.int64)
    t = np.arange(AUDIO_LEN, dtype=np.float64) / SAMPLE_RATE
    lo = np.array([BANDS_HZ[k][0] for k in y], dtype=np.float64)
    hi = np.array([BANDS_HZ[k][1] for k in y], dtype=np.float64)
    f = rng.uniform(lo, hi)
    amp = rng.uniform(0.3, 1.0, size=n)
    phase = rng.uniform(0, 2 * np.pi, size=n)
    x = amp[:, None] * np.sin(2 * np.pi * f[:, None] * t[None, :] + phase[:, None])
    x = x + rng.normal(0, 0.3, size=x.shape)
    x = (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + 1e-7)
    return {"input_values": x.astype(np.float32)}, y


SEG_STRIDE = 4  # Segformer's logits are at H/4 x W/4


def rectangles_seg(rng: np.random.Generator, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """3 classes per pixel: background 0, red rectangle 1, blue rectangle 2; 1-3 rectangles per
    image, corners on the 4-px grid so the label map at the logits' resolution (16x16) is exact;
    later rectangles paint over earlier ones (in the image and the labels alike)."""
    img = _background(rng, n)
    g = IMAGE // SEG_STRIDE
    y = np.zeros((n, g, g), dtype=np.int64)
    for i in range(n):
        for _ in range(int(rng.integers(1, 4))):
            cls = int(rng.integers(1, 3))
            h, w = (int(v) for v in rng.integers(2, 7, size=2))  # cells of 4 px
            r, c = int(rng.integers(0, g - h + 1)), int(rng.integers(0, g - w + 1))
            colour = COLOURS[0 if cls == 1 else 2] + rng.uniform(-0.1, 0.1, size=3).astype(np.float32)
            R, C, H, W = (v * SEG_STRIDE for v in (r, c, h, w))
            img[i, :, R:R + H, C:C + W] = colour[:, None, None] + rng.normal(0, 0.05, size=(3, H, W))
            y[i, r:r + h, c:c + w] = cls
    return {"pixel_values": _normalise(img)}, y


DET_CLASSES, DET_MAX = 3, 3


def coloured_boxes(rng: np.random.Generator, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Detection: 1-3 non-overlapping axis-aligned squares (10-20 px) per image, class by colour
    (red 0, green 1, blue 2). y is float32 (N, 3, 5), rows [class, cx, cy, w, h] normalised to
    [0, 1], padding rows class -1 (and zeros). Squares keep a 2-px gap so no two share a centre cell
    of an 8x8 grid."""
    img = _background(rng, n)
    y = np.zeros((n, DET_MAX, 5), dtype=np.float32)
    y[:, :, 0] = -1
    for i in range(n):
        want, placed, cells = int(rng.integers(1, DET_MAX + 1)), [], set()
        for _ in range(100):
            if len(placed) == want:
                break
            s = int(rng.integers(10, 21))
            r, c = (int(v) for v in rng.integers(0, IMAGE - s + 1, size=2))
            cell = (int((r + s / 2) // 8), int((c + s / 2) // 8))
            if cell in cells or any(r < r2 + s2 + 2 and r2 < r + s + 2 and c < c2 + s2 + 2 and c2 < c + s + 2
                                    for r2, c2, s2 in placed):
                continue
            placed.append((r, c, s))
            cells.add(cell)
        for j, (r, c, s) in enumerate(placed):
            cls = int(rng.integers(0, DET_CLASSES))
            colour = COLOURS[cls] + rng.uniform(-0.1, 0.1, size=3).astype(np.float32)
            img[i, :, r:r + s, c:c + s] = colour[:, None, None] + rng.normal(0, 0.05, size=(3, s, s))
            y[i, j] = [cls, (c + s / 2) / IMAGE, (r + s / 2) / IMAGE, s / IMAGE, s / IMAGE]
    return {"pixel_values": _normalise(img)}, y
