"""The docs' machinery (issue #38): which code blocks .ci/docs_examples.py runs and which it skips (and why), the
repository's pages parse under that rule, every runtime page keeps the one template, and the ship contract's
reference models (docs/_gen/ship_schema.py) describe what ``write_ship`` writes, key for key."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


runner = _load("docs_examples", ROOT / ".ci" / "docs_examples.py")


def test_bash_sh_and_python_blocks_run_and_other_fences_never_do():
    text = """# A page

```bash
edgekit --help
```

```sh
echo sh
```

```python
import edgekit
```

```text
ship: tflite-int8 ...
```

```yaml
baseline: fp32
```

```
bare
```
"""
    blocks = runner.extract(text, "page.md")
    assert [(b.line, b.lang, b.runnable, b.skip) for b in blocks] == [
        (3, "bash", True, None),
        (7, "bash", True, None),
        (11, "python", True, None),
        (15, "text", False, None),
        (19, "yaml", False, None),
        (23, "", False, None),
    ]
    assert blocks[0].code == "edgekit --help\n"


def test_a_not_run_marker_skips_its_block_with_the_reason_blank_lines_allowed_between():
    text = """Text.

<!-- not run: needs an Android phone on adb -->

```bash
edgekit devices add pixel --adb 0123
```

```bash
edgekit --help
```
"""
    skipped, runs = runner.extract(text, "p.md")
    assert skipped.skip == "needs an Android phone on adb" and skipped.line == 5
    assert runs.skip is None


def test_indented_blocks_in_list_items_are_found_and_dedented():
    text = "- item:\n\n  ```bash\n  echo one\n    echo two\n  ```\n"
    (b,) = runner.extract(text, "p.md")
    assert b.lang == "bash" and b.code == "echo one\n  echo two\n"


def test_a_longer_outer_fence_holds_an_example_block_without_running_it():
    text = "````markdown\n<!-- not run: x -->\n```bash\nrm -rf /\n```\n````\n"
    (b,) = runner.extract(text, "p.md")
    assert b.lang == "markdown" and not b.runnable and "rm -rf" in b.code


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!-- not run -->\n```bash\nx\n```\n", "write the reason"),
        ("<!-- not run: -->\n```bash\nx\n```\n", "write the reason"),
        ("<!-- not run: phone -->\nSome prose.\n```bash\nx\n```\n", "right before its code block"),
        ("<!-- not run: phone -->\n", "no code block after it"),
        ("<!-- not run: phone -->\n<!-- not run: board -->\n```bash\nx\n```\n", "no code block after it"),
        ("<!-- not run: output -->\n```text\nx\n```\n", "never runs"),
        ("```bash\nnever closed\n", "never closed"),
    ],
)
def test_a_malformed_marker_or_fence_is_an_error_naming_the_line(text, message):
    with pytest.raises(runner.MarkerError, match=message) as exc:
        runner.extract(text, "page.md")
    assert str(exc.value).startswith("page.md:")


def test_the_repositorys_pages_parse_and_the_readmes_demo_command_runs():
    pages = runner.default_pages()
    assert ROOT / "README.md" in pages and ROOT / "docs" / "guides" / "language-models.md" in pages
    blocks = {p: runner.extract(p.read_text(encoding="utf-8"), str(p)) for p in pages}
    readme = [b for b in blocks[ROOT / "README.md"] if b.runnable]
    assert any("bash examples/digits/run.sh" in b.code and b.skip is None for b in readme)
    assert any("bash .ci/test.sh" in b.code and b.skip for b in readme)  # the whole suite: CI's default step
    assert sum(b.runnable and b.skip is None for bs in blocks.values() for b in bs) >= 30


def test_the_runner_runs_blocks_in_order_in_one_folder_and_fails_on_a_broken_one(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\necho hi > note.txt\n```\n\n```python\nprint(open('note.txt').read().strip())\n```\n\n"
        "<!-- not run: needs a phone -->\n```bash\nexit 9\n```\n\n```bash\nedgekit --no-such-flag\n```\n"
    )
    assert runner.main([str(page)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"run   .*page.md:1 \(bash, [\d.]+ s\): ok", out)
    assert re.search(r"run   .*page.md:5 \(python, [\d.]+ s\): ok", out)
    assert "page.md:10 (bash): needs a phone" in out
    assert re.search(r"page.md:14 \(bash, [\d.]+ s\): FAILED \(exit 2\)", out)
    assert "ran 3 blocks" in out and "1 failed; 1 marked not run" in out


RUNTIME_SECTIONS = ["Overview", "Precisions", "Options", "Troubleshooting", "Op support"]


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "runtimes").glob("*.md")), ids=lambda p: p.stem)
def test_every_runtime_page_keeps_the_template(page):
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert re.findall(r"^## (.+)$", text, flags=re.M) == RUNTIME_SECTIONS


def _ship_models():
    from docs._gen.ship_schema import RuntimeConfig, ShipManifest  # the root is on pytest's pythonpath

    return ShipManifest, RuntimeConfig


@pytest.mark.parametrize("task", ["fixed-graph", "text-generation"])
def test_the_ship_reference_describes_a_ship_json_that_shipped_nothing(tmp_path, task):
    """A run that ships nothing writes ship.json with `shipped: false`; the reference's model forbids unknown keys,
    and a file the earlier run shipped there is gone."""
    from docs._gen.ship_schema import NothingShipped
    from edgekit.orchestration.ship import nothing_shipped, write_nothing_shipped

    ship = tmp_path / "ship"
    ship.mkdir()
    (ship / "model.onnx").write_bytes(b"an earlier run's file")
    (ship / "ship.json").write_text(json.dumps({"file": "model.onnx", "files": ["model.onnx"]}))
    write_nothing_shipped(tmp_path, task, "no variant passes the gate")
    doc = json.loads((ship / "ship.json").read_text())
    NothingShipped.model_validate(doc)
    assert doc["shipped"] is False and not (ship / "model.onnx").exists()
    assert nothing_shipped(ship) == "no variant passes the gate"


def test_the_ship_reference_describes_every_key_write_ship_writes(tmp_path):
    """ship.json and runtime.json are written as dicts; the reference's models forbid unknown keys, so a key added
    to either without a description here fails."""
    from edgekit.artifact import Artifact, IOSpec, LineageStep, TensorSpec
    from edgekit.formats import Format
    from edgekit.orchestration.ship import write_ship
    from edgekit.report.model import LatencyMs, RuntimeInfo, VariantResult

    ShipManifest, RuntimeConfig = _ship_models()
    src_io = IOSpec(
        inputs=(
            TensorSpec(name="x", shape=(None, 1, 8, 8), dtype="float32", layout="NCHW"),
            TensorSpec(name="sr", shape=(), dtype="int64"),
            TensorSpec(name="state", shape=(2, 1, 4), dtype="float32"),
        ),
        outputs=(
            TensorSpec(name="y", shape=(None, 10), dtype="float32"),
            TensorSpec(name="stateN", shape=(2, 1, 4), dtype="float32"),
        ),
    )
    file_io = IOSpec(
        inputs=(
            TensorSpec(
                name="serving_default_x:0",
                shape=(1, 8, 8, 1),
                dtype="int8",
                layout="NHWC",
                transpose=(0, 2, 3, 1),
                scale=0.5,
                zero_point=-3,
            ),
            *src_io.inputs[1:],
        ),
        outputs=src_io.outputs,
    )
    stream = {
        "constants": {"sr": 16000},
        "constants_from": {"sr": "--const"},
        "state": [{"output": "stateN", "input": "state", "shape": [2, 1, 4], "dtype": "float32"}],
        "batch": 1,
        "order": "one sample at a time",
    }
    lineage = (
        LineageStep(kind="source", name="source", config={"stream": stream}),
        LineageStep(
            kind="convert",
            name="onnx->tflite",
            config={"input_shapes": {"x": [1, 1, 8, 8]}, "input_shapes_from": "data"},
        ),
    )
    model = tmp_path / "m.tflite"
    model.write_bytes(b"not a real model: write_ship copies it")
    art = Artifact.from_file(model, Format.TFLITE, file_io, lineage=lineage, precision="int8")
    lat = LatencyMs(
        warmup=1,
        runs=3,
        mean=1.0,
        std=0.0,
        min=1.0,
        max=1.0,
        p50=1.0,
        p90=1.0,
        p99=1.0,
        ci95=[1.0, 1.0],
        cov=0.0,
        outliers=0,
        stable=True,
        weighted_p50=1.1,
        buckets=[{"shapes": [[1, 8, 8]], "samples": 3, "p50": 1.0, "mean": 1.0, "runs": 3}],
    )
    rt_info = RuntimeInfo(name="litert", threads=2, options={"xnnpack": "off"})
    v = VariantResult(
        name="tflite-int8",
        format="tflite",
        precision="int8",
        runtime=rt_info,
        size_bytes=model.stat().st_size,
        sha256=art.sha256,
        latency_ms=lat,
    )
    write_ship(tmp_path / "out", v, art, src_io)

    meta = json.loads((tmp_path / "out" / "ship" / "ship.json").read_text())
    ship = ShipManifest.model_validate(meta)  # extra="forbid": an undescribed key fails here
    face = ship.interface
    assert face is not None and face.state and face.constants == {"sr": 16000} and face.order
    x = face.inputs[0]
    assert x.transpose == [0, 2, 3, 1] and x.quantization and x.static_shape == [1, 1, 8, 8]
    assert [i.role for i in face.inputs] == [None, "constant", "state"]
    assert ship.measured.by_shape and ship.measured.weighted_p50_ms == 1.1
    rt = RuntimeConfig.model_validate(json.loads((tmp_path / "out" / "ship" / "runtime.json").read_text()))
    assert rt.runtime == "litert" and rt.apply


def _dict_keys(node) -> dict[str, object]:
    """A dict literal's string keys, each with its value node (``**spread`` entries skipped)."""
    import ast

    return {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}


def test_the_ship_reference_describes_every_key_a_language_models_ship_json_has():
    """A language model's ship folder needs a whole language model to run; the literals of its ship.json and
    runtime.json are read from the source instead, key by key, against the reference's models: the one writer's
    (orchestration/ship.write_file_set: meta, rt) and the generator's contract (llm/ship.lm_contract)."""
    import ast

    ShipManifest, RuntimeConfig = _ship_models()

    def literals_of(path: str, name: str) -> dict:
        tree = ast.parse((ROOT / "edgekit" / path).read_text(encoding="utf-8"))
        fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
        return {
            t.id: n.value
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
            for t in n.targets
            if isinstance(t, ast.Name)
        }

    literals = literals_of("orchestration/ship.py", "write_file_set")
    contract = _dict_keys(literals_of("llm/ship.py", "lm_contract")["contract"])
    meta, rt = {**_dict_keys(literals["meta"]), **contract}, _dict_keys(literals["rt"])

    def fields(model) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    assert set(meta) <= fields(ShipManifest), set(meta) - fields(ShipManifest)
    assert set(rt) <= fields(RuntimeConfig), set(rt) - fields(RuntimeConfig)
    nested = {
        "generator": ShipManifest.model_fields["generator"],
        "eval": ShipManifest.model_fields["eval"],
        "measured": ShipManifest.model_fields["measured"],
    }
    for key, field in nested.items():
        options = getattr(field.annotation, "__args__", (field.annotation,))  # Generator | None -> Generator
        model = next(a for a in options if hasattr(a, "model_fields"))
        keys = set(_dict_keys(meta[key]))
        assert keys and keys <= fields(model), (key, keys - fields(model))
