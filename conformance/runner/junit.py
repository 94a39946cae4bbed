"""``kvarena conform --junit-xml FILE``: the report as JUnit XML, so CI systems show it natively.

One test case per vector file (failed, skipped when it stopped early at ``safety``, passed) and one per
invariant ID of the lockstep machine run (failed when the machine's divergence names it, skipped when no
step could have broken it), plus ``machine.divergence`` for a machine divergence that names no invariant
and ``coverage.vacuity`` for a run that exercised nothing (exit 3).  The suite's properties carry the
coverage counters.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from kvarena.conformance.runner.coverage import EXPOSURE


def _case(suite: ET.Element, classname: str, name: str, seconds: float = 0.0) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")


def to_xml(report: Any) -> ET.ElementTree:
    """The JUnit tree of a :class:`kvarena.conformance.runner.conform.Report`."""
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=f"kvarena-conform[{report.impl}@{report.level}]",
                          time=f"{report.seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in report.coverage.to_json().items():
        ET.SubElement(props, "property", name=key, value=json.dumps(value, sort_keys=True))
    tests = failures = skipped = 0
    for v in report.vectors:
        case = _case(suite, "kvarena.vectors", v.path.name)
        tests += 1
        if v.status == "failed":
            failures += 1
            ET.SubElement(case, "failure", message=(v.inv + ": " if v.inv else "") + (v.summary or v.message)[:500],
                          type=v.inv or "divergence").text = v.message
        elif v.status == "stopped":
            skipped += 1
            ET.SubElement(case, "skipped", message=v.message[:500])
    if report.machine_status != "skipped":
        exposure = report.machine_coverage.exposure
        for inv in EXPOSURE:
            case = _case(suite, "kvarena.machine", inv)
            tests += 1
            if report.machine_status == "failed" and report.machine_inv == inv:
                failures += 1
                ET.SubElement(case, "failure", message=report.machine_message.splitlines()[0][:500],
                              type=inv).text = report.machine_message
            elif not exposure.get(inv, 0):
                skipped += 1
                ET.SubElement(case, "skipped", message=f"no machine step could have broken {inv}")
        if report.machine_status == "failed" and report.machine_inv not in EXPOSURE:
            case = _case(suite, "kvarena.machine", "divergence")
            tests += 1
            failures += 1
            ET.SubElement(case, "failure", message=report.machine_message.splitlines()[0][:500],
                          type="divergence").text = report.machine_message
    if report.ok and report.vacuous:
        case = _case(suite, "kvarena.coverage", "vacuity")
        tests += 1
        failures += 1
        ET.SubElement(case, "failure", message=report.vacuous[:500], type="vacuous").text = report.vacuous
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    return ET.ElementTree(suites)


def write(report: Any, path: Path | str) -> None:
    tree = to_xml(report)
    ET.indent(tree)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)
