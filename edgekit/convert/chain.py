"""Route fallback for a conversion: try each route in turn, keep the first whose output is within
its parity tolerance, record which route won (and why the others lost) in the lineage. When no
route passes, fail with every route's error: a model that no route converts faithfully never ships.

TFLite routes, in order:
1. onnx2tf from the ONNX model, with the requested options;
2. onnx2tf with ``pseudo_ops`` when the model has ops (Erf from exact GELU, Asin...) whose TF lowering
   is a Flex op: onnx2tf rebuilds them from builtin ops;
3. onnx2tf with ``keep_input_layout`` (NCHW inputs kept, transposes inside the graph), the option
   that most often fixes a layout problem; skipped, with the reason recorded, for a model without a
   rank 3-5 input (nothing to keep);
4. onnx2tf with its own defaults (``onnx2tf.convert(input_onnx_file_path=..., output_folder_path=...)``
   on the ONNX file as given, no edgekit options but ``not_use_onnxsim``, so that an ``onnxsim`` on
   PATH changes nothing): whatever onnx2tf converts by itself, edgekit converts too (it still finds
   the layout and checks parity on every output);
5. litert-torch straight from the PyTorch program (fp32 only; when installed and the source is PyTorch).

A route that fails in an unexpected way (a converter's internal error) is recorded with its error
and the next route is tried; only bad input and a missing package stop the chain. A route that fails
exactly as an earlier one is summarised as "same error as <route>".
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..artifact import Artifact
from ..errors import BadInputError, ConversionError, DataError, MissingExtraError
from ..inputs.data import Dataset
from ..inputs.stateful import stream_of
from .onnx2tf_errors import strip_ansi
from .onnx_to_tflite import TfliteConfig, onnx_to_tflite
from .opcheck import model_ops, require_static_shapes, sizes_from_samples
from .tflite.host_harness import PSEUDO_OP_FIXES
from .torch_to_tflite import available, torch_to_tflite

HOP = "->tflite"


@dataclass(frozen=True)
class Route:
    name: str
    run: Callable[[Path], Artifact]
    skip: str | None = None  # why this route cannot apply to the model: recorded, never run


def tflite_routes(onnx_art: Artifact, cfg: TfliteConfig, *, source=None, calib: Dataset | None,
                  parity_inputs: list[np.ndarray] | None, route: str = "auto") -> list[Route]:
    ref_all = source.reference_all if source is not None else None
    ref_name = source.reference_name if source is not None else None

    def o2t(c: TfliteConfig) -> Callable[[Path], Artifact]:
        return lambda p: onnx_to_tflite(onnx_art, p, c, calib=calib, parity_inputs=parity_inputs,
                                        chain_reference_all=ref_all, chain_reference_name=ref_name)

    routes = [Route("onnx2tf", o2t(cfg))]
    fixes = _pseudo_op_fixes(onnx_art)
    if fixes and not cfg.pseudo_ops:
        routes.append(Route(f"onnx2tf(pseudo_ops={','.join(fixes)})", o2t(cfg.model_copy(update={"pseudo_ops": fixes}))))
    if not cfg.keep_input_layout:
        routes.append(Route("onnx2tf(keep_input_layout)", o2t(cfg.model_copy(update={"keep_input_layout": True})),
                            skip=_keep_layout_skip(onnx_art)))
    if not cfg.plain_defaults:
        routes.append(Route("onnx2tf(defaults)", o2t(cfg.model_copy(update={
            "plain_defaults": True, "keep_input_layout": False, "pseudo_ops": []}))))
    if source is not None and source.program is not None and cfg.precision == "fp32":
        if available():
            routes.append(Route("litert-torch", lambda p: torch_to_tflite(
                source, p, precision=cfg.precision, parity_inputs=parity_inputs or list(calib.xs),  # type: ignore[union-attr]
                onnx_art=onnx_art, parity_samples=cfg.parity_samples)))
    if route != "auto":
        routes = [r for r in routes if r.name.split("(")[0] == route]
        if not routes:
            raise ConversionError(f"route {route!r} is not available for this model/precision", hop=HOP,
                                  hint="routes: onnx2tf, litert-torch (fp32, PyTorch source, pip install "
                                  "'edgekit[litert-torch]')")
    return routes


def _keep_layout_skip(onnx_art: Artifact) -> str | None:
    """Why keep_input_layout cannot apply: it keeps NCW/NCHW/NCDHW (rank 3-5) inputs as they are, and
    a model without one has nothing to keep (onnx2tf asserts on any other input it is named)."""
    ranks = [len(s.shape) for s in onnx_art.io.inputs]
    if ranks and not any(r in (3, 4, 5) for r in ranks):
        return (f"skipped: keep_input_layout keeps channels-first (rank 3-5) inputs as they are; this model's "
                f"input{'s are' if len(ranks) > 1 else ' is'} rank {', '.join(str(r) for r in ranks)}, "
                "with no layout to keep")
    return None


def _pseudo_op_fixes(onnx_art: Artifact) -> list[str]:
    import onnx


    ops = model_ops(onnx.load(str(onnx_art.path), load_external_data=False))
    return [PSEUDO_OP_FIXES[o] for o in ops if o in PSEUDO_OP_FIXES]


def first_passing(routes: list[Route], out_path: str | Path, hop: str = HOP) -> Artifact:
    """Run ``routes`` until one is within tolerance; its file lands at ``out_path``."""
    out_path = Path(out_path)
    tried: list[dict] = []
    hints: list[str] = []  # the failed routes' own hints (onnx_to_tflite's names edgekit's options), first first
    for i, r in enumerate(routes):
        if r.skip:
            tried.append({"route": r.name, "error": r.skip, "skipped": True})
            continue
        staged = out_path.with_name(f".{out_path.stem}.route{i}{out_path.suffix}")
        try:
            art = r.run(staged)
        except (DataError, MissingExtraError):
            raise  # the user's input is wrong, or a package is missing: no other route fixes that
        except BadInputError as exc:
            tried.append({"route": r.name, "error": strip_ansi(str(exc).splitlines()[0])})
            if exc.hint:
                hints.append(exc.hint)
            _remove(staged)
            continue
        except Exception as exc:  # a converter's internal error: this route's result, the next one may work
            first = strip_ansi(str(exc)).strip().splitlines()[0][:300] if str(exc).strip() else ""
            tried.append({"route": r.name, "error": f"{type(exc).__name__}: {first}"})
            _remove(staged)
            continue
        step = art.lineage[-1]
        violations = step.metrics.get("parity_violations") or []
        if violations:
            tried.append({"route": r.name, "error": "parity: " + "; ".join(violations)})
            _remove(staged)
            continue
        staged.replace(out_path)
        metrics = {**step.metrics, "route": r.name, "routes_tried": tried}
        new_step = step.model_copy(update={"metrics": metrics})
        return art.model_copy(update={"path": out_path.resolve(), "lineage": (*art.lineage[:-1], new_step)})
    raise ConversionError(
        "no route converted the model within its parity tolerance:\n" + "\n".join(_summary(tried)), hop=hop,
        hint=hints[0] if hints else "the first route's error names the blocking op; keep this model on ONNX "
        "Runtime (--to onnx) or change that op in the model")


def _same_key(error: str) -> str:
    """An error with what differs between two runs of the same failure taken out: the route's own
    prefix, Keras' layer counters ('tf.nn.softmax_2'), temporary folders."""
    e = re.sub(r"^\[[^\]]*\]\s*", "", error)
    e = re.sub(r"\b((?:tf|model)[\w.]*?)_\d+\b", r"\1", e)
    return re.sub(r"\S*\.edgekit-[\w-]+\S*", "<tmp>", e)


def _summary(tried: list[dict]) -> list[str]:
    """One line per route; a route that failed exactly as an earlier one says so instead of repeating it."""
    seen: dict[str, str] = {}
    lines = []
    for t in tried:
        key = _same_key(t["error"])
        if key in seen and not t.get("skipped"):
            lines.append(f"  - {t['route']}: same error as {seen[key]}")
        else:
            seen.setdefault(key, t["route"])
            lines.append(f"  - {t['route']}: {t['error']}")
    return lines


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def stream_fed(onnx_art: Artifact) -> list[str]:
    """The model inputs edgekit feeds itself (a stream's state and constants), not the data, in the model's order."""

    stream = stream_of(onnx_art)
    return [] if stream is None else [n for n in stream.inputs if n in stream.fed]


def _refuse_streams(onnx_art: Artifact) -> None:
    """A model with inputs edgekit feeds itself (--const, --state: edgekit/inputs/stateful.py) is not converted to
    TFLite: every route converts, sizes and checks parity on the data's inputs alone, so such a build failed on
    a size it did know (Silero VAD: "dynamic sizes ... state (axes [1])", the state being zeros of (2, 1, 128)).
    Say what is missing instead; onnxruntime runs such a model with its constants and state carried."""
    fed = stream_fed(onnx_art)
    if fed:
        raise ConversionError(
            f"the model's inputs {', '.join(map(repr, fed))} are fed by edgekit (--const/--state), and the TFLite "
            "routes do not take such inputs yet: they convert, size and check parity on the data's inputs alone",
            hop="onnx->tflite", hint="its ONNX candidates (onnxruntime, INT8 included) run it with the constants "
                                     "fed and the state carried")


def convert_to_tflite(onnx_art: Artifact, out_path: str | Path, cfg: TfliteConfig | None = None, *, source=None,
                      calib: Dataset | None = None, parity_inputs: list[np.ndarray] | None = None,
                      route: str = "auto") -> Artifact:
    import onnx


    cfg = cfg or TfliteConfig()
    # TFLite graphs are static: dynamic sizes the user did not give are the data's (the shapes the model is
    # evaluated at; recorded in the lineage's config); with no data, say so once, before trying any route
    try:
        model = onnx.load(str(onnx_art.path), load_external_data=False)
    except Exception as exc:  # DecodeError, OSError: not an ONNX file
        raise ConversionError(f"{onnx_art.path} is not a readable ONNX model: {type(exc).__name__}", hop=HOP,
                              hint="re-export the model, or check the file was copied completely") from exc
    _refuse_streams(onnx_art)
    given = {k: tuple(v) for k, v in (cfg.input_shapes or {}).items()}
    sized = sizes_from_samples(model, parity_inputs or (list(calib.xs) if calib is not None else None), given,
                               fed=set(stream_fed(onnx_art)))
    if sized != given:
        cfg = cfg.model_copy(update={"input_shapes": {k: list(v) for k, v in sized.items()},
                                     "input_shapes_from": "data"})
    require_static_shapes(model, "onnx->tflite", sized)
    routes = tflite_routes(onnx_art, cfg, source=source, calib=calib, parity_inputs=parity_inputs, route=route)
    return first_passing(routes, out_path)


__all__ = ["Route", "tflite_routes", "first_passing", "convert_to_tflite"]
