"""Helpers shared by the PyTorch-level passes (prune, distill): rebuilding an nn.Module from a
.pt2, writing programs, counting params/MACs, training on the user's --train-data, exporting a
torch artifact to ONNX. Imported only by those passes (torch is heavy)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..artifact import Artifact, IOSpec
from ..convert.torch_to_onnx import export_onnx
from ..errors import DataError, ModelLoadError, PassError
from ..inputs.data import Dataset
from ..inputs.source import _io_from_program, from_program, import_object


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` intra-op threads, restoring the previous setting. Small models train much
    faster on one thread, and on a busy machine more threads than free cores spin-wait."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def load_program(art: Artifact):
    try:
        return torch.export.load(str(art.path))
    except Exception as exc:  # a .pt2 that cannot be read: report it, with the file
        raise ModelLoadError(f"{art.path} is not a readable torch.export program: {exc}") from exc


def module_from_arch(arch: str, ep, role: str) -> torch.nn.Module:
    """An nn.Module built by ``arch`` (module:factory) carrying the weights of the program ``ep``."""
    factory = import_object(arch)
    try:
        model = factory()
    except TypeError as exc:
        raise ModelLoadError(f"{arch} cannot be built without arguments ({exc})",
                             hint="point arch at a factory function that takes no arguments") from exc
    state = {**ep.state_dict, **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"the {role} program's weights do not fit architecture {arch}: "
                             f"{str(exc).splitlines()[0][:300]}",
                             hint="arch must be the class the .pt2 was exported from") from exc
    return model


def example_input(io: IOSpec, batch: int = 1) -> tuple[torch.Tensor, ...]:
    out = []
    for spec in io.inputs:
        shape = [batch] + [d if d is not None else 1 for d in spec.shape[1:]]
        out.append(torch.zeros(shape, dtype=getattr(torch, spec.dtype)))
    return tuple(out)


def save_ep(ep, dest: Path) -> None:
    """torch.export.save, atomically. The archive records its file name, so it is written under a
    fixed name in a private folder first: the same program gives the same bytes (and cache key)."""
    import shutil
    import tempfile

    tmpdir = Path(tempfile.mkdtemp(prefix=".edgekit-save-", dir=dest.parent))
    try:
        torch.export.save(ep, str(tmpdir / "model.pt2"))
        (tmpdir / "model.pt2").replace(dest)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def save_program(module: torch.nn.Module, io: IOSpec, dest: Path) -> IOSpec:
    """Export ``module`` with a dynamic batch axis (so later torch passes can train it in batches)
    and save it atomically; returns its IO spec."""
    try:
        module = module.eval()
    except NotImplementedError:  # a torch.export module is always in eval mode
        pass
    example = example_input(io, batch=2)
    batch = torch.export.Dim("batch", min=1, max=4096)
    dyn = tuple({0: batch} for _ in example)
    try:
        ep = torch.export.export(module, example, dynamic_shapes=dyn)
    except Exception:  # some models pin the batch (e.g. a reshape to 1): keep a static batch of 1
        ep = torch.export.export(module, example_input(io, 1))
    save_ep(ep, dest)
    spec = _io_from_program(ep)
    # keep the user's input names (the agent and the eval data are keyed on them)
    return IOSpec(inputs=tuple(s.model_copy(update={"name": o.name, "shape": o.shape})
                               for s, o in zip(spec.inputs, io.inputs)),
                  outputs=tuple(s.model_copy(update={"shape": (o.shape[0], *s.shape[1:])})
                                for s, o in zip(spec.outputs, io.outputs)) if io.outputs else spec.outputs)


def count(module: torch.nn.Module, io: IOSpec) -> dict[str, int]:
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(module.eval(), example_input(io, 1))
    return {"params": int(params), "macs": int(macs)}


def require_train(ds: Dataset | None, what: str) -> Dataset:
    if ds is None:
        raise DataError(f"{what} needs training data", hint="pass --train-data TRAIN.npz (x and y), or set "
                        "train_data in the recipe")
    if ds.y is None:
        raise DataError(f"training data {ds.path} has no labels; {what} trains on them", hint="add y=labels")
    return ds


def batches(ds: Dataset, batch_size: int, gen: torch.Generator) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
    n = ds.n
    perm = torch.randperm(n, generator=gen).numpy()
    for i in range(0, n, batch_size):
        idx = perm[i:i + batch_size]
        yield ([torch.from_numpy(np.ascontiguousarray(x[idx])).float() if x.dtype.kind == "f"
                else torch.from_numpy(np.ascontiguousarray(x[idx])) for x in ds.xs],
               torch.from_numpy(ds.y.reshape(n, -1)[idx, 0].astype(np.int64)))


def predict(module: Any, xs: tuple[np.ndarray, ...], batch: int = 256) -> np.ndarray:
    """Logits of ``module`` (batch size 1 when the program pins it)."""
    outs = []
    step = batch if _batches_ok(module, xs) else 1
    with torch.no_grad():
        for i in range(0, len(xs[0]), step):
            out = module(*[torch.from_numpy(np.ascontiguousarray(x[i:i + step])).float()
                           if x.dtype.kind == "f" else torch.from_numpy(x[i:i + step]) for x in xs])
            if isinstance(out, (tuple, list)):
                out = out[0]
            outs.append(out.detach().float().numpy())
    return np.concatenate(outs)


def _batches_ok(module: Any, xs: tuple[np.ndarray, ...]) -> bool:
    try:
        with torch.no_grad():
            module(*[torch.from_numpy(np.ascontiguousarray(x[:2])).float() if x.dtype.kind == "f"
                     else torch.from_numpy(x[:2]) for x in xs])
        return True
    except Exception:  # a program exported with a static batch of 1 rejects batches
        return False


def accuracy(module: Any, ds: Dataset | None) -> float | None:
    if ds is None or ds.y is None:
        return None
    logits = predict(module, ds.xs)
    return round(float((logits.argmax(1) == ds.y.reshape(ds.n, -1)[:, 0]).mean() * 100.0), 4)


def export_torch_artifact(art: Artifact, dest: Path, parity_xs: list[np.ndarray]) -> Artifact:
    """A torch artifact (output of a torch pass, maybe with a dynamic batch) as ONNX with a static
    batch of 1 like the baseline, keeping its lineage; parity is checked against the program."""

    ep = load_program(art)
    gm = ep.module()
    try:
        static = torch.export.export(gm, example_input(art.io, 1))
    except Exception as exc:
        raise PassError(f"re-exporting {art.path.name} with a batch of 1 failed: {exc}") from exc
    src = dataclasses.replace(from_program(static, art.path), artifact=art)
    return export_onnx(src, dest, parity_xs)
