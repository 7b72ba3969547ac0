"""Per-runtime device wheels (targets' wheels.runtime_packages): installed only when asked for."""

import pytest

from edgekit.devices.provision import download_command, runtime_wheels, wheelhouse_lacks
from edgekit.errors import BadInputError
from edgekit.inputs.targets import load_target


def test_executorch_wheels_come_only_with_the_runtime():
    spec = load_target("rpi5")
    assert runtime_wheels(spec, ()) == ([], [])
    assert runtime_wheels(spec, ["onnxruntime", "litert"]) == ([], [])  # in the target's packages
    packages, pins = runtime_wheels(spec, ["executorch"])
    assert pins == ["torch==2.10.0", "executorch==1.1.0"]
    assert "sympy>=1.13.3" in packages and not any(p.startswith("nvidia") for p in packages)
    assert "torch" not in " ".join(spec.wheels.packages)  # the default provisioning stays light


def test_pins_are_downloaded_without_their_declared_dependencies(tmp_path):
    spec = load_target("jetson-orin-nano")
    _, pins = runtime_wheels(spec, ["executorch"])
    argv = download_command(spec, tmp_path, pins, no_deps=True)
    assert "--no-deps" in argv and argv[-2:] == pins and "pip" not in argv[-3:]
    assert argv[argv.index("--python-version") + 1] == "3.10"


def test_a_target_without_executorch_wheels_refuses_clearly():
    with pytest.raises(BadInputError) as err:
        runtime_wheels(load_target("rpi4"), ["executorch"])  # not among its runtimes: nothing runs on a Cortex-A72
    assert "has no runtime 'executorch'" in err.value.message and "litert" in err.value.hint
    spec = load_target("rpi5")
    bare = spec.model_copy(update={"wheels": spec.wheels.model_copy(update={"runtime_packages": {}})})
    with pytest.raises(BadInputError) as err:
        runtime_wheels(bare, ["executorch"])
    assert "no device wheels for the executorch runtime" in err.value.message and "Cortex-A72" in err.value.hint
    with pytest.raises(BadInputError):
        runtime_wheels(load_target("rpi5"), ["coreml"])


def test_wheelhouse_lacks_checks_the_pins_by_file_name(tmp_path):
    spec = load_target("rpi5")
    assert wheelhouse_lacks(spec, tmp_path)
    (tmp_path / "numpy-2.4.6-cp311-cp311-manylinux_2_28_aarch64.whl").write_bytes(b"")
    assert not wheelhouse_lacks(spec, tmp_path)
    assert wheelhouse_lacks(spec, tmp_path, ["executorch"])
    (tmp_path / "torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl").write_bytes(b"")
    (tmp_path / "executorch-1.1.0-cp311-cp311-manylinux_2_28_aarch64.whl").write_bytes(b"")
    assert wheelhouse_lacks(spec, tmp_path, ["executorch"])  # its other packages (unpinned: any version) too
    for w in ("filelock-4.3.1", "typing_extensions-4.16.0", "sympy-1.14.0", "networkx-3.6.1", "jinja2-3.1.6",
              "fsspec-2026.9.0"):
        (tmp_path / f"{w}-py3-none-any.whl").write_bytes(b"")
    assert not wheelhouse_lacks(spec, tmp_path, ["executorch"])
    # a runtime whose wheels are all `packages` (no no_deps pins): each checked, the pinned one at its version
    assert wheelhouse_lacks(spec, tmp_path, ["openvino"])
    (tmp_path / "openvino_telemetry-2025.2.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "openvino-2026.4.0-22959-cp311-cp311-manylinux_2_35_aarch64.whl").write_bytes(b"")
    assert wheelhouse_lacks(spec, tmp_path, ["openvino"])  # another version than the pin
    (tmp_path / "openvino-2026.4.1-23100-cp311-cp311-manylinux_2_35_aarch64.whl").write_bytes(b"")
    assert not wheelhouse_lacks(spec, tmp_path, ["openvino"])
    (tmp_path / "executorch-1.1.0-cp311-cp311-manylinux_2_28_aarch64.whl").unlink()
    (tmp_path / "executorch-1.1.01-cp311-cp311-manylinux_2_28_aarch64.whl").write_bytes(b"")
    assert wheelhouse_lacks(spec, tmp_path, ["executorch"])


def test_openvino_and_ncnn_pins_on_every_board_are_the_host_s_versions():
    """The IR and .param/.bin files are made on the host: every board that lists OpenVINO or NCNN installs the
    host's very versions (a bump on the host without the boards' pins would ship files another release reads)."""
    import importlib.metadata as md

    from edgekit.inputs.targets import list_targets, load_target

    boards = []
    for name in list_targets():
        spec = load_target(name)
        for runtime in ("openvino", "ncnn"):
            if runtime not in spec.runtimes or spec.transport != "ssh":
                continue
            boards.append(name)
            pins = dict(p.split("==") for p in spec.wheels.runtime_packages[runtime].packages if "==" in p)
            assert pins.get(runtime) == md.version(runtime), (name, runtime, pins)
            # OpenVINO's aarch64 wheels are manylinux_2_35: the board's platforms must take them
            assert runtime != "openvino" or "manylinux_2_35_aarch64" in spec.wheels.platforms, name
    assert {"rpi4", "rpi5", "jetson-orin-nano"} <= set(boards)


def test_llama_cpp_wheel_is_built_on_the_host_not_downloaded(tmp_path, monkeypatch):
    """llama-cpp-python has no aarch64 wheel on any index: the target names it `host_built`, provisioning builds it
    (llama.cpp cross-compiled for the target's march) instead of asking pip, and installs it without deps."""
    from edgekit.devices import llama_cpp_build as llama_cpp
    from edgekit.devices import provision

    spec = load_target("rpi5")
    packages, pins = runtime_wheels(spec, ["llama.cpp"])
    assert pins == ["llama-cpp-python==0.3.36"] and "diskcache>=5.6.1" in packages
    assert provision.host_built_wheels(spec, ["llama.cpp"]) == pins
    assert provision.host_built_wheels(spec, ["executorch"]) == []
    built: list = []

    def fake_board_wheel(board, say=print):  # the build itself is tested in tests/integration/test_llamacpp_arm64
        built.append(board)
        w = tmp_path / "cache" / f"llama_cpp_python-{llama_cpp.VERSION}-py3-none-linux_aarch64.whl"
        w.parent.mkdir(exist_ok=True)
        w.write_bytes(b"wheel")
        return w

    downloads: list = []
    monkeypatch.setattr(llama_cpp, "board_wheel", fake_board_wheel)
    monkeypatch.setattr(provision, "_pip_download", lambda spec, argv: downloads.append(argv))
    provision.build_wheelhouse(spec, tmp_path / "wh", runtimes=["llama.cpp"])
    assert built == [llama_cpp.BoardBuild("aarch64", "armv8.2-a+dotprod+fp16")]
    assert not any("llama-cpp-python==0.3.36" in argv for argv in downloads)  # never asked of pip
    assert (tmp_path / "wh" / "llama_cpp_python-0.3.36-py3-none-linux_aarch64.whl").read_bytes() == b"wheel"
    with pytest.raises(BadInputError, match="no `march`"):
        provision.build_host_wheel(spec.model_copy(update={"march": None}), pins[0], tmp_path, print)
    with pytest.raises(BadInputError, match="this edgekit builds llama-cpp-python 0.3.36"):
        provision.build_host_wheel(spec, "llama-cpp-python==0.3.30", tmp_path, print)
    with pytest.raises(BadInputError, match="cannot build torch==2.10.0"):
        provision.build_host_wheel(spec, "torch==2.10.0", tmp_path, print)


def test_a_board_build_for_an_architecture_without_a_cross_compiler_is_refused():
    from edgekit.devices.llama_cpp_build import BoardBuild, LlamaCppMissing

    with pytest.raises(LlamaCppMissing, match="cross-builds llama.cpp for aarch64 only, not armv7l"):
        BoardBuild("armv7l", "armv7-a").cmake_args()
    args = BoardBuild("aarch64", "armv8-a").cmake_args()
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_NATIVE=ON" not in args and "-DGGML_OPENMP=OFF" in args
    assert "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++" in args and "-DGGML_CPU_ARM_ARCH=armv8-a" in args


def test_a_board_build_made_with_other_configure_arguments_is_stale(tmp_path, monkeypatch):
    """A cached board wheel is reused only when its build.json records this edgekit's configure arguments; one made
    with others is built again (checked before and again after waiting for the build lock)."""
    import json

    from edgekit.devices import llama_cpp_build as llama_cpp

    monkeypatch.setenv("EDGEKIT_LLAMA_CPP_DIR", str(tmp_path))
    board = llama_cpp.BoardBuild("aarch64", "armv8-a")
    assert not llama_cpp._board_fresh(board)  # nothing built
    board.root.mkdir(parents=True)
    (board.root / board.wheel_name).write_bytes(b"wheel")
    (board.root / "build.json").write_text(json.dumps({"cmake_args": board.cmake_args()}))
    assert llama_cpp._board_fresh(board)
    (board.root / "build.json").write_text(json.dumps({"cmake_args": [*board.cmake_args(), "-DGGML_OPENMP=ON"]}))
    assert not llama_cpp._board_fresh(board)
