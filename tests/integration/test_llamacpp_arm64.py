"""llama.cpp on the arm64 twin (issue #37): GGUF files made on the host run on an emulated Raspberry Pi 5 through
the llama.cpp edgekit cross-compiles for the Pi's cores (Debian's aarch64 cross compiler, -march of the target
file; never built under emulation) and ships inside the binding's wheel:

    edgekit sim up pi5-llama --arch arm64 --target rpi5 --runtime llama.cpp
    edgekit deploy my-llama/ --eval-text eval.txt --target rpi5 --device pi5-llama

Real components only: the twin's Debian Python, the wheel pip installs there, llama.cpp's own library decoding
on the emulated A76, the device's logits scored on the host. Correctness only: timings under emulation mean
nothing. Needs root, the twin's tools, llama.cpp built on this host (`bash .ci/llama_cpp.sh` builds it and runs
this file) and `g++-aarch64-linux-gnu`.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from conftest import run_edgekit_subprocess
from test_arm64_twin import _missing, started_twin

pytestmark = [pytest.mark.emu, pytest.mark.root, pytest.mark.slow, pytest.mark.llamacpp]

NAME = "pi5-llama"
TARGET = "rpi5"
VARIANTS = ("ort-fp32", "gguf-q8_0", "gguf-q4_0")


def _no_llama_cpp() -> str | None:
    from edgekit.llm.llama_cpp import LlamaCppMissing, tools

    try:
        tools()
    except LlamaCppMissing as exc:
        return f"{exc.message} ({exc.hint})"
    if shutil.which("aarch64-linux-gnu-g++") is None:
        return "the aarch64 cross compiler is missing (apt-get install g++-aarch64-linux-gnu; .ci/install.sh does)"
    return None


_skip = _missing() or _no_llama_cpp()
if _skip:
    pytestmark.append(pytest.mark.skip(reason=_skip))


@pytest.fixture(scope="module")
def llama_twin():
    yield from started_twin(NAME, TARGET, ["llama.cpp"], "llama-arm64")


def test_the_board_wheel_holds_aarch64_libraries_and_builds_byte_identical(tmp_path):
    """The wheel provisioning sends: the binding's Python with llama.cpp's libraries for aarch64 inside, tagged
    for the board, a RECORD pip verifies; writing it twice from the same build gives the same bytes (a
    re-provision sends nothing new)."""
    from edgekit.devices import llama_cpp_build as llama_cpp
    from edgekit.inputs.targets import load_target

    spec = load_target(TARGET)
    board = llama_cpp.BoardBuild(spec.arch, spec.march or "")
    wheel = llama_cpp.board_wheel(board)
    assert wheel.name == f"llama_cpp_python-{llama_cpp.VERSION}-py3-none-linux_aarch64.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert names == sorted(names)
        libs = [n for n in names if n.startswith("llama_cpp/lib/")]
        assert {"llama_cpp/lib/libllama.so", "llama_cpp/lib/libggml-cpu.so"} <= set(libs), libs
        for n in libs:  # ELF, e_machine 183 (EM_AARCH64), little endian
            head = zf.read(n)[:20]
            assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183, n
        assert "Tag: py3-none-linux_aarch64" in zf.read(f"llama_cpp_python-{llama_cpp.VERSION}.dist-info/WHEEL"
                                                        ).decode()
        record = zf.read(f"llama_cpp_python-{llama_cpp.VERSION}.dist-info/RECORD").decode()
        assert all(f"{n}," in record for n in names), "every file is in RECORD"
    libs_src = {}
    with zipfile.ZipFile(wheel) as zf:
        for n in libs:
            p = tmp_path / "libs" / Path(n).name
            p.parent.mkdir(exist_ok=True)
            p.write_bytes(zf.read(n))
            libs_src[p.name] = p
    host = llama_cpp._binding_wheel(llama_cpp.sdist_path(download=False), tmp_path / "host")
    a, b = tmp_path / "a.whl", tmp_path / "b.whl"
    llama_cpp._write_board_wheel(host, libs_src, a, board)
    llama_cpp._write_board_wheel(host, libs_src, b, board)
    assert a.read_bytes() == b.read_bytes() == wheel.read_bytes()


def test_gguf_files_generate_on_the_twin_and_are_scored_from_its_logits(llama_twin, tmp_path):
    """The race on the Pi twin with llama.cpp beside onnxruntime: the GGUF files are made on the host, run by
    the twin's llama.cpp (version from its wheel), and their KLD is computed from the logits the twin returned."""
    from lm_zoo import build_tiny_lm, eval_text

    folder, text = build_tiny_lm("llama"), eval_text(tmp_path / "text")
    res = run_edgekit_subprocess("deploy", folder, "--eval-text", text, "--target", TARGET, "--device", NAME,
                                 "--context", "48", "--lm-variants", ",".join(VARIANTS), "--threads", "1", "--runs", "6",
                                 "--warmup", "1", "--min-seconds", "0.1", "--out", tmp_path / "lm", timeout=1800)
    assert res.exit_code in (0, 1), res.stdout[-2000:] + res.stderr[-3000:]
    rep = json.loads((tmp_path / "lm" / "report.json").read_text())
    assert rep["device"]["arch"] == "aarch64" and rep["device"]["emulated"] is True
    got = {v["name"]: v for v in rep["variants"]}
    assert set(VARIANTS) == set(got), rep["decision"]
    for name in ("gguf-q8_0", "gguf-q4_0"):
        v = got[name]
        assert v["format"] == "gguf" and v["runtime"]["name"] == "llama.cpp", v["runtime"]
        assert v["runtime"]["version"] == "0.3.36", v["runtime"]
        g, q = v["generation"], v["quality"]
        assert g["decode_tokens_per_s"] > 0 and g["prefill"], name
        assert g["kv_cache_mb"] and g["kv_cache_mb"] > 0 and g["kv_cache_source"] == "runtime", g
        # scored from the twin's logits: quantized, so not zero; inside the default tolerance
        assert 0 < q["kld_mean"] < 0.05, (name, q["kld_mean"])
    assert got["gguf-q8_0"]["quality"]["kld_mean"] < got["gguf-q4_0"]["quality"]["kld_mean"]
    print("[llama-arm64] on the twin: " + "; ".join(
        f"{n} {v['runtime']['name']} {v['runtime']['version']}: KLD {v['quality']['kld_mean']:.2e}, "
        f"{v['generation']['decode_tokens_per_s']:.1f} tok/s (emulated)" for n, v in got.items()))
