"""Fail a CI step whose tests did not all run: `python .ci/require_all_ran.py STEP junit.xml`.
A missing runtime makes its tests skip, and a skipped route must not pass as green."""

import sys
import xml.etree.ElementTree as ET

step, path = sys.argv[1], sys.argv[2]
s = ET.parse(path).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
tests, skipped = int(s.get("tests")), int(s.get("skipped"))
bad = int(s.get("failures")) + int(s.get("errors"))
if tests == 0 or skipped or bad:
    sys.exit(f"{step} step: {tests} tests, {skipped} skipped, {bad} failed: the route was not exercised")
print(f"{step} step: {tests} {step} tests ran, none skipped")
