"""JUnit XML view of the gate: one test case per gate check, so any CI shows pass/fail natively.

Test case names are ``<check>`` in class ``edgekit.gate.<variant>``; a failed check carries a
``<failure>`` whose message is the check's message (with the p-value where a test was made).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from .model import Report


def render_junit(r: Report) -> str:
    checks = r.gate.checks
    units = r.fleet.units if r.fleet is not None else []
    failures = sum(not c.passed for c in checks) + sum(u.state != "measured" or u.gate_passed is False for u in units)
    tests = len(checks) + len(units)
    suites = ET.Element("testsuites", name="edgekit", tests=str(tests), failures=str(failures), errors="0")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"edgekit.gate.{r.target}",
        tests=str(tests),
        failures=str(failures),
        errors="0",
        skipped="0",
        timestamp=r.created_at,
        hostname=r.device.name or "",
    )
    props = ET.SubElement(suite, "properties")
    cw = r.compared_with
    for k, v in (
        ("target", r.target),
        ("device", r.device.name),
        ("baseline_variant", r.baseline),
        ("model_sha256", r.model.get("sha256")),
        ("edgekit_version", r.edgekit_version),
        ("compared_with", cw and cw.path),
        ("latency_method", cw and cw.method),
        ("gate_passed", r.gate.passed),
    ):
        if v is not None:
            ET.SubElement(props, "property", name=k, value=str(v))
    for c in checks:
        case = ET.SubElement(
            suite, "testcase", classname=f"edgekit.gate.{c.variant or 'report'}", name=c.name, time="0"
        )
        detail = [f"value: {c.value}", f"limit: {c.limit}"]
        if c.p_value is not None:
            detail.append(f"p-value: {c.p_value:.3g}")
        if not c.passed:
            f = ET.SubElement(case, "failure", message=c.message, type="GateCheckFailed")
            f.text = "\n".join([c.message, *detail])
        else:
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join([c.message, *detail])
    for u in r.fleet.units if r.fleet is not None else []:  # a fleet run: one case per unit
        case = ET.SubElement(
            suite, "testcase", classname="edgekit.orchestration.fleet", name=u.name, time=str(u.seconds or 0)
        )
        if u.state != "measured":
            ET.SubElement(
                case, "failure", message=f"unit {u.name} unmeasured: {u.error}", type="UnitFailed"
            ).text = f"{u.error_kind}: {u.error}"
        elif u.gate_passed is False:
            ET.SubElement(
                case, "failure", message=f"unit {u.name} fails: {', '.join(u.failed_checks)}", type="GateCheckFailed"
            ).text = json.dumps(u.latency_ms)
        else:
            ET.SubElement(case, "system-out").text = json.dumps(u.latency_ms)
    if not checks:
        # An empty suite reads as "nothing ran" in most CIs: say why instead.
        case = ET.SubElement(suite, "testcase", classname="edgekit.gate.report", name="gate", time="0")
        ET.SubElement(case, "system-out").text = "the gate had no checks to run"
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
