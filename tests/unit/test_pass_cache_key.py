"""The pass cache's code key (edgekit/orchestration/cache.py: code_fingerprint): every converter module, the
ones in convert/'s subfolders included, and edgekit's model loading count, for edgekit's passes and for a pass
that lives outside edgekit (a user's); a change in any of them is never answered from a stale entry."""

from __future__ import annotations

from pathlib import Path

import edgekit
from edgekit.orchestration import cache

PKG = Path(edgekit.__file__).resolve().parent


def _hashed(monkeypatch, pass_file: Path) -> set[Path]:
    seen: set[Path] = set()
    real = cache._hash_path

    def record(p: Path) -> str:
        seen.add(Path(p).resolve())
        return real(p)

    monkeypatch.setattr(cache, "_hash_path", record)
    cache.code_fingerprint(pass_file)
    return seen


def test_the_key_covers_every_converter_module(monkeypatch):
    seen = _hashed(monkeypatch, PKG / "passes" / "quantize_ort.py")
    assert PKG / "convert" / "tflite" / "int8_converter.py" in seen  # a subfolder of convert/
    assert {PKG / "convert" / "torch_to_onnx.py", PKG / "inputs" / "source.py", PKG / "artifact.py"} <= seen
    assert PKG / "passes" / "_torch.py" in seen  # the pass's siblings


def test_a_pass_outside_edgekit_keys_on_edgekit_converters_too(monkeypatch, tmp_path):
    mine = tmp_path / "my_pass.py"
    mine.write_text("X = 1\n")
    seen = _hashed(monkeypatch, mine)
    assert mine.resolve() in seen and PKG / "convert" / "tflite" / "int8_converter.py" in seen


def test_a_changed_converter_changes_the_key(monkeypatch, tmp_path):
    pass_file = PKG / "passes" / "quantize_ort.py"
    before = cache.code_fingerprint(pass_file)
    target = (PKG / "convert" / "tflite" / "int8_converter.py").resolve()
    real = cache._hash_path
    monkeypatch.setattr(cache, "_hash_path", lambda p: "changed" if Path(p).resolve() == target else real(p))
    assert cache.code_fingerprint(pass_file) != before
