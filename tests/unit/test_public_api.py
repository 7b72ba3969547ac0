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
