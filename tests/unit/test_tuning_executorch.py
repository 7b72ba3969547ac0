"""ExecuTorch's runtime setting as a search dimension: the XNNPACK thread pool (process-wide, sized
by the request's threads before the program loads; torch.set_num_threads does not size it) read
back by the agent, the guard that keeps a loaded program from running on a destroyed pool, no
runtime options taken, and the threads tuned in a real search on the local target. Skipped without
the `executorch` package; .ci/executorch.sh runs this file and fails if anything in it skipped."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.unit.agent_loader import AGENT_PATH

HAS_EXECUTORCH = importlib.util.find_spec("executorch") is not None
pytestmark = [pytest.mark.executorch,  # CI's ExecuTorch step runs these, after it installs executorch
              pytest.mark.skipif(not HAS_EXECUTORCH, reason="executorch is not installed "
                                 "(pip install 'edgekit[executorch]'; CI: bash .ci/executorch.sh)")]

# In a fresh process (the pool is process-wide): load the .pte at the given threads, report the
# pool's size, the process's OS threads and the outputs on a fixed input.
_CHILD = """
import json, os, sys
import numpy as np
sys.path.insert(0, sys.argv[1])  # the built agent (a zipapp), imported as the host does
from edgekit_agent.runners import ExecuTorchRunner
r = ExecuTorchRunner(sys.argv[2], int(sys.argv[3]))
from executorch.extension.pybindings import _C
x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
y = r.run([x])[0]
print(json.dumps({"threads": r.threads, "pool": _C._threadpool_get_thread_count(),
                  "os_threads": len(os.listdir("/proc/self/task")), "y": y.tolist()}))
"""


class Wide(__import__("torch").nn.Module):
    """64 -> 256 -> 10: mostly weights, so its int8 .pte is a quarter of the fp32 ONNX file."""

    def __init__(self):
        import torch

        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    import torch

    d = tmp_path_factory.mktemp("et-tuning")
    m = Wide().eval()
    torch.export.save(torch.export.export(m, (torch.zeros(1, 64),)), d / "wide.pt2")
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    with torch.no_grad():
        y = m(torch.from_numpy(x)).argmax(1).numpy()
    np.savez(d / "eval.npz", x=x, y=y)
    np.savez(d / "calib.npz", x=np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32))
    return d


@pytest.fixture(scope="module")
def wide_pte(wide):
    from edgekit.convert.torch_to_executorch import torch_to_executorch
    from edgekit.inputs.source import load_source

    src = load_source(wide / "wide.pt2", workdir=wide)
    return torch_to_executorch(src, wide / "wide.pte", parity_inputs=[np.load(wide / "eval.npz")["x"][:8]]).path


def _child(pte, threads):
    res = subprocess.run([sys.executable, "-c", _CHILD, str(AGENT_PATH), str(pte), str(threads)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_xnnpack_pool_is_sized_by_the_threads(wide_pte):
    one, two = _child(wide_pte, 1), _child(wide_pte, 2)
    assert (one["threads"], one["pool"]) == (1, 1) and (two["threads"], two["pool"]) == (2, 2)
    # pthreadpool runs n-1 workers beside the calling thread: one more OS thread at 2 threads
    assert two["os_threads"] - one["os_threads"] == 1
    np.testing.assert_allclose(two["y"], one["y"], rtol=1e-5, atol=1e-5)


def test_a_loaded_program_keeps_its_pool(wide_pte):
    """Resizing the process-wide pool under a loaded program crashed it (executorch 1.5.1): the
    runner refuses instead, and loads at the pool's own size without resetting it."""
    from executorch.extension.pybindings import _C

    from edgekit.agent.inprocess import load_agent

    agent = load_agent()
    size = _C._threadpool_get_thread_count()
    first = agent.runners.ExecuTorchRunner(str(wide_pte), size)
    other = 1 if size != 1 else 2
    with pytest.raises(agent.AgentFailure) as err:
        agent.runners.ExecuTorchRunner(str(wide_pte), other)
    assert err.value.kind == "bad_request" and "process-wide" in str(err.value)
    assert _C._threadpool_get_thread_count() == size  # untouched
    second = agent.runners.ExecuTorchRunner(str(wide_pte), size)  # the same size shares the pool
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(first.run([x])[0], second.run([x])[0])


def test_executorch_takes_no_runtime_options(wide_pte):
    from edgekit.agent.inprocess import load_agent

    agent = load_agent()
    with pytest.raises(agent.AgentFailure) as err:
        agent.runners.ExecuTorchRunner.open(str(wide_pte), {"threads": 1, "runtime_options": {"xnnpack": "off"}})
    assert err.value.kind == "bad_request" and "takes no runtime options" in str(err.value)


def test_search_tunes_the_executorch_threads_and_ships_them(wide, tmp_path):
    """A size budget only the int8 .pte meets makes it the selected variant, so the tuning rows are
    ExecuTorch's: the pool at 2 threads, measured by the agent, and runtime.json says how to size it."""
    from edgekit.inputs.recipe import VariantSpec
    from edgekit.inputs.targets import MeasureDefaults, load_target
    from edgekit.variant_search import SearchOptions, search

    local = load_target("local")
    target = local.model_copy(update={"runtimes": [*local.runtimes, "executorch"],
                                      "limits": local.limits.model_copy(update={"model_size_mb": 0.05})})
    fast = MeasureDefaults(warmup=3, runs=20, min_seconds=0.0, max_runs=20)
    spec = VariantSpec(name="et-int8", passes=[{"convert": {"to": "executorch", "precision": "int8"}}])
    out = tmp_path / "out"
    r = search(wide / "wide.pt2", eval_data=wide / "eval.npz", calib_data=wide / "calib.npz", target=target,
               out=out, max_accuracy_drop=10.0,
               options=SearchOptions(candidates=[spec], host_filter=False, measure=fast, screening_runs=10))
    rows = {c.name: c for c in r.search.candidates}
    assert rows["et-int8"].status in ("selected", "finalist"), rows["et-int8"].reason
    assert [n for n in rows if "@" in n] == ["et-int8@t2"]
    v = r.variant("et-int8@t2")
    assert v.runtime.name == "executorch" and v.runtime.threads == 2  # the pool's size, read back
    assert not v.runtime.options and v.latency_ms.runs >= 20
    assert r.variant("et-int8").runtime.threads == 1
    sel = next(v for v in r.variants if v.selected)
    assert sel.name.startswith("et-int8")
    cfg = json.loads((out / "ship" / "runtime.json").read_text())
    assert cfg["runtime"] == "executorch" and cfg["threads"] == sel.runtime.threads and cfg["file"].endswith(".pte")
    assert cfg["apply"]["threadpool_threads"] == sel.runtime.threads
    assert "_unsafe_reset_threadpool" in cfg["apply"]["call"]
