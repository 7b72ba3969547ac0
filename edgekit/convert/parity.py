"""Output parity between a converted model and its reference, on the eval inputs.

Default tolerances per precision (absolute, per output: every output of the model counts). They are
deliberately loose enough for honest float reordering and tight enough to catch a wrong layout
or a broken op. INT8 is judged by accuracy drop in the gate, not by these numbers; its parity is
reported for information and checked only for gross breakage.

Integer and bool outputs (argmax indices, masks) are compared as exact agreement: the fraction of
elements that are equal, held to the precision's top-1 agreement. NaN where the reference has NaN
counts as equal; NaN or inf anywhere else is an infinite error.

Top-1 agreement (the argmax along the class axis) is a classification check. It is held to the bar on a
model's only output, and on each output of a multi-output model whose rows are a probability distribution
(softmax: non-negative, summing to 1; log-softmax). The other outputs of a multi-output model are
regressions as often as not (a face detector's box offsets and landmarks, a detector's boxes, an
embedding), whose argmax means nothing: there it is reported, not held, and cosine and max abs error judge
them. (Seen on MTCNN's ONet: INT8 kept landmark cosine 0.99 while their "argmax" agreed on 0.906.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from ..errors import ConversionError


@dataclass(frozen=True)
class Tolerance:
    max_abs_err: float | None
    min_cosine: float
    min_top1_agreement: float | None


TOLERANCES = {
    "fp32": Tolerance(max_abs_err=1e-3, min_cosine=0.99999, min_top1_agreement=0.99),
    "fp16": Tolerance(max_abs_err=5e-2, min_cosine=0.999, min_top1_agreement=0.98),
    # bf16 keeps 8 bits of mantissa (fp16: 11): relative errors ~0.4%, so no absolute bound
    "bf16": Tolerance(max_abs_err=None, min_cosine=0.998, min_top1_agreement=0.97),
    "int8": Tolerance(max_abs_err=None, min_cosine=0.95, min_top1_agreement=0.90),
    "mixed": Tolerance(max_abs_err=None, min_cosine=0.95, min_top1_agreement=0.90),
    # gross breakage only (a wrong layout, a tensor calibrated on -3.4e38: cosines 0.04-0.17 seen), for INT8 files
    # whose quality a metric judges next (the search's candidates): real INT8 models read 0.93-0.99 here, and
    # cosine does not rank them (PP-OCR's detector at 0.930 kept its mask IoU, its recognizer at 0.947 lost half)
    "int8-breakage": Tolerance(max_abs_err=None, min_cosine=0.80, min_top1_agreement=None),
    # the same bar for a reduced-precision float file judged by its metric next (OpenVINO's bf16/f16 in the search)
    "breakage": Tolerance(max_abs_err=None, min_cosine=0.80, min_top1_agreement=None),
}


@dataclass(frozen=True)
class ParityResult:
    reference: str
    max_abs_err: float
    mean_abs_err: float
    cosine: float
    top1_agreement: float | None
    n: int
    exact_agreement: float | None = None  # integer/bool outputs: fraction of elements equal
    # the output's rows are a probability distribution along the class axis (softmax / log-softmax)
    distribution: bool = False
    # top-1 agreement held to the bar: a model's only output, or a distribution (see the module doc)
    top1_held: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    def violations(self, precision: str) -> list[str]:
        tol = TOLERANCES.get(precision, TOLERANCES["fp32"])
        out = []
        if self.exact_agreement is not None:
            need = tol.min_top1_agreement if tol.min_top1_agreement is not None else 0.99
            if self.exact_agreement < need:
                out.append(f"exact agreement {self.exact_agreement:.3f} < {need} (integer output)")
            return out
        if tol.max_abs_err is not None and self.max_abs_err > tol.max_abs_err:
            out.append(f"max abs error {self.max_abs_err:.3g} > {tol.max_abs_err:g}")
        if self.cosine < tol.min_cosine:
            out.append(f"cosine {self.cosine:.6f} < {tol.min_cosine}")
        if tol.min_top1_agreement is not None and self.top1_agreement is not None and self.top1_held \
                and self.top1_agreement < tol.min_top1_agreement:
            out.append(f"top-1 agreement {self.top1_agreement:.3f} < {tol.min_top1_agreement}")
        return out


def _discrete(a: np.ndarray) -> bool:
    return np.asarray(a).dtype.kind in "biu"


def _class_axis(ref: np.ndarray) -> int | None:
    """The axis whose argmax is a prediction: classes of (N, C), per query/token of (N, Q, C), per
    pixel of (N, C, H, W). The argmax over a whole flattened map would mean nothing."""
    if ref.ndim == 2 and ref.shape[1] > 1:
        return 1
    if ref.ndim == 3 and ref.shape[2] > 1:
        return 2
    if ref.ndim == 4 and ref.shape[1] > 1:
        return 1
    return None


def _distribution(ref: np.ndarray, axis: int) -> bool:
    """Rows that are probabilities (softmax) or log-probabilities (log-softmax) along ``axis``."""
    if not np.isfinite(ref).all():
        return False
    if ref.min() >= 0 and ref.max() <= 1 + 1e-4:
        return bool(np.allclose(ref.sum(axis=axis), 1.0, atol=1e-3))
    if ref.max() <= 1e-4:
        return bool(np.allclose(np.log(np.exp(ref).sum(axis=axis)), 0.0, atol=1e-3))
    return False


def compare(ref: np.ndarray, got: np.ndarray, reference: str) -> ParityResult:
    exact = _discrete(ref)
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        if ref.size == got.size:
            got = got.reshape(ref.shape)
        else:
            raise ConversionError(f"output shape {got.shape} differs from the reference {ref.shape}", hop="parity")
    n = int(len(ref)) if ref.ndim else 1
    if ref.size == 0:
        return ParityResult(reference=reference, max_abs_err=0.0, mean_abs_err=0.0, cosine=1.0, top1_agreement=None,
                            n=n, exact_agreement=1.0 if exact else None)
    same = (ref == got) | (np.isnan(ref) & np.isnan(got))  # inf == inf and NaN where the reference has NaN
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(ref - got))
    diff = np.where(np.isnan(diff), np.inf, diff)
    finite = np.isfinite(ref) & np.isfinite(got)
    a, b = np.where(finite, ref, 0.0).reshape(-1), np.where(finite, got, 0.0).reshape(-1)
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    cosine = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
    if np.any(~same & ~finite):  # NaN/inf where the reference has none: no agreement claimed
        cosine = 0.0
    top1, dist = None, False
    axis = _class_axis(ref)
    if not exact and axis is not None and finite.all():
        top1 = float(np.mean(ref.argmax(axis) == got.argmax(axis)))
        dist = _distribution(ref, axis)
    return ParityResult(reference=reference, max_abs_err=float(diff.max()), mean_abs_err=float(diff.mean()),
                        cosine=cosine, top1_agreement=top1, n=n,
                        exact_agreement=float(np.mean(same)) if exact else None, distribution=dist)


def compare_outputs(refs: list[np.ndarray], gots: list[np.ndarray], reference: str,
                    names: list[str]) -> dict[str, ParityResult]:
    """Parity of every output, keyed by output name in the model's order. An integer/bool reference
    output is compared as exact agreement."""
    if not (len(refs) == len(gots) == len(names)):
        raise ConversionError(f"{len(gots)} outputs to compare with {len(refs)} reference outputs "
                              f"({len(names)} names)", hop="parity")
    names = [n if n not in names[:i] else f"{n}#{i}" for i, n in enumerate(names)]
    out = {}
    for k, (name, r, g) in enumerate(zip(names, refs, gots)):
        try:
            res = compare(r, g, reference)
            # several outputs: argmax agreement is held only where the output is a class distribution
            out[name] = res if len(refs) == 1 or res.distribution else replace(res, top1_held=False)
        except ConversionError as exc:  # name the output; say when another output has the reference's shape
            shape = tuple(np.shape(r))
            other = [j for j, o in enumerate(gots) if j != k and tuple(np.shape(o)) == shape]
            raise ConversionError(f"output {name!r}: {exc.message.split('] ', 1)[-1]}"
                                  + (f" (converted output #{other[0]} has that shape: the outputs were matched "
                                     "out of order)" if other else ""), hop="parity") from exc
    return out


def parity_metrics(results: dict[str, ParityResult], precision: str) -> dict:
    """Lineage metrics of a hop: ``parity`` (the first output, as before), ``parity_outputs``
    {name: dict} and ``parity_violations`` over all outputs (prefixed with the output name when
    there are several)."""
    items = list(results.items())
    several = len(items) > 1
    violations = [f"{name}: {v}" if several else v for name, r in items for v in r.violations(precision)]
    return {"parity": items[0][1].to_dict() if items else None,
            "parity_outputs": {name: r.to_dict() for name, r in items},
            "parity_violations": violations}
