"""The public surface a release pipeline types against: every public error importable from ``edgekit``,
``Report.shipped`` (the variant to ship, not recomputed by callers), ``Report.raise_for_gate()`` raising
``GateFailed`` (exit 1) with the failed checks."""

from __future__ import annotations

import pytest
from report_factory import report, variant

import edgekit
from edgekit.inputs.recipe import GateConfig


def test_every_public_error_is_exported_from_edgekit_with_its_exit_code():
    from edgekit import errors

    for name in ("EdgekitError", "BadInputError", "GateFailed", "DeviceError", "TransportError", "AgentError",
                 "AgentRunFailed", "DeviceLockedError", "BudgetExceeded", "ModelLoadError", "DataError",
                 "ConversionError", "MissingExtraError"):
        cls = getattr(edgekit, name)
        assert issubclass(cls, errors.EdgekitError) and name in edgekit.__all__, name
    assert edgekit.GateFailed.exit_code == 1 and edgekit.BadInputError.exit_code == 2
    assert edgekit.DeviceLockedError.exit_code == edgekit.AgentRunFailed.exit_code == 3


def test_raise_for_gate_and_shipped():
    from edgekit.report.model import Decision

    ok = report([variant("fp32"), variant("int8", precision="int8", acc=97.8)])
    ok.decision = Decision(ship="int8", reason="fastest")
    assert ok.raise_for_gate() is ok and ok.shipped is ok.variant("int8")
    bad = report([variant("fp32"), variant("int8", precision="int8", acc=90.0)], cfg=GateConfig(max_accuracy_drop=1.0))
    assert not bad.gate.passed and bad.shipped is None
    with pytest.raises(edgekit.GateFailed) as err:
        bad.raise_for_gate()
    assert err.value.exit_code == 1 and err.value.failed
    assert any(name.startswith("accuracy") and "int8" in name for name, _ in err.value.failed), err.value.failed


def test_deploy_overrides_are_deploy_options_fields_with_their_types():
    """``edgekit.deploy(..., **overrides)`` is typed by ``DeployOverrides``: the same names and types as
    ``DeployOptions``, so the two cannot drift apart."""
    import dataclasses

    from edgekit.orchestration.options import DeployOptions, DeployOverrides

    def norm(t: object) -> str:  # a TypedDict keeps its string annotations as ForwardRef
        return str(getattr(t, "__forward_arg__", t)).replace("'", "").replace('"', "").replace(" ", "")

    options = {f.name: norm(f.type) for f in dataclasses.fields(DeployOptions)}
    overrides = {k: norm(v) for k, v in DeployOverrides.__annotations__.items()}
    assert overrides == options


def test_a_misspelt_or_mistyped_override_is_a_type_error(tmp_path):
    """What a release pipeline's type check sees (mypy, as CI's lint step runs it on examples/release_pipeline.py)."""
    from pathlib import Path

    from mypy import api

    snippet = tmp_path / "pipeline.py"
    snippet.write_text('import edgekit\n\n'
                       'edgekit.deploy("m.pt2", eval_data="e.npz", max_acuracy_drop=0.5)\n'
                       'edgekit.deploy("m.pt2", eval_data="e.npz", runs="many")\n'
                       'edgekit.deploy("m.pt2", eval_data="e.npz", max_accuracy_drop=0.5, runs=50, '
                       'baseline_report="r.json", search_options=edgekit.SearchOptions())\n'
                       'edgekit.profile("m.pt2", eval_data="e.npz", threads=2)\n')
    root = Path(__file__).resolve().parents[2]
    out, err, code = api.run(["--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
                              "--cache-dir", str(root / ".mypy_cache"), str(snippet)])
    lines = [ln for ln in out.splitlines() if ": error:" in ln]
    assert code == 1 and len(lines) == 2, out + err
    assert ':3: error: Unexpected keyword argument "max_acuracy_drop"' in lines[0]
    assert ':4: error: Argument "runs" to "deploy" has incompatible type "str"' in lines[1]
