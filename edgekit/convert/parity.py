"""Output parity between a converted model and its reference, on the eval inputs.

Default tolerances per precision (absolute on the first output, e.g. logits). They are
deliberately loose enough for honest float reordering and tight enough to catch a wrong layout
or a broken op. INT8 is judged by accuracy drop in the gate, not by these numbers; its parity is
reported for information and checked only for gross breakage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
    "int8": Tolerance(max_abs_err=None, min_cosine=0.95, min_top1_agreement=0.90),
    "mixed": Tolerance(max_abs_err=None, min_cosine=0.95, min_top1_agreement=0.90),
}


@dataclass(frozen=True)
class ParityResult:
    reference: str
    max_abs_err: float
    mean_abs_err: float
    cosine: float
    top1_agreement: float | None
    n: int

    def to_dict(self) -> dict:
        return asdict(self)

    def violations(self, precision: str) -> list[str]:
        tol = TOLERANCES.get(precision, TOLERANCES["fp32"])
        out = []
        if tol.max_abs_err is not None and self.max_abs_err > tol.max_abs_err:
            out.append(f"max abs error {self.max_abs_err:.3g} > {tol.max_abs_err:g}")
        if self.cosine < tol.min_cosine:
            out.append(f"cosine {self.cosine:.6f} < {tol.min_cosine}")
        if tol.min_top1_agreement is not None and self.top1_agreement is not None \
                and self.top1_agreement < tol.min_top1_agreement:
            out.append(f"top-1 agreement {self.top1_agreement:.3f} < {tol.min_top1_agreement}")
        return out


def compare(ref: np.ndarray, got: np.ndarray, reference: str) -> ParityResult:
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        if ref.size == got.size:
            got = got.reshape(ref.shape)
        else:
            raise ConversionError(f"output shape {got.shape} differs from the reference {ref.shape}", hop="parity")
    diff = np.abs(ref - got)
    a, b = ref.reshape(-1), got.reshape(-1)
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    cosine = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
    top1 = None
    if ref.ndim >= 2 and ref.reshape(len(ref), -1).shape[1] > 1:
        top1 = float(np.mean(ref.reshape(len(ref), -1).argmax(1) == got.reshape(len(got), -1).argmax(1)))
    return ParityResult(reference=reference, max_abs_err=float(diff.max()), mean_abs_err=float(diff.mean()),
                        cosine=cosine, top1_agreement=top1, n=int(len(ref)))
