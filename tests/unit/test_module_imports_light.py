"""Every edgekit module imports at module level only what is light (docs/architecture.md, "Files by concern"):
the frameworks (torch, TensorFlow, onnxruntime...) load inside the functions that need them. That is what lets
edgekit's own imports sit at the top of each file without slowing `import edgekit` or `edgekit --help`; a module
that starts importing a framework at its top fails here, named, with the framework."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import edgekit

HEAVY = ("torch", "tensorflow", "onnx", "onnxruntime", "transformers", "coremltools", "openvino", "nncf", "ncnn",
         "onnx2tf", "ai_edge_litert", "executorch", "torchao", "neural_compressor", "paramiko", "scipy", "matplotlib",
         "llama_cpp", "gguf", "polars", "duckdb")
# the two modules whose job is a framework, imported only from inside functions (marked `# heavy:`)
HEAVY_BY_DESIGN = {"edgekit.passes._torch", "edgekit.convert.tflite.litert_probe"}

PROBE = """
import importlib, json, sys
heavy, mods = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
out = {}
for m in mods:
    before = {k.split(".")[0] for k in sys.modules}
    importlib.import_module(m)
    new = sorted({k.split(".")[0] for k in sys.modules} - before & heavy)
    if new:
        out[m] = new
print(json.dumps(out))
"""


def _modules() -> list[str]:
    root = Path(edgekit.__file__).parent
    names = []
    for f in sorted(root.rglob("*.py")):
        parts = ("edgekit", *f.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in HEAVY_BY_DESIGN and "_device_agents" not in name:
            names.append(name)
    return names


def test_no_edgekit_module_imports_a_framework_at_module_level():
    mods = _modules()
    assert len(mods) > 150  # the walk found the package (a wrong root would pass vacuously)
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(mods)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    loaded = json.loads(res.stdout.strip().splitlines()[-1])
    assert loaded == {}, (f"importing these modules loads a framework: {loaded} (the module, or one it imports at "
                          "module level, imports it at its top: move that import into the function that needs it)")
