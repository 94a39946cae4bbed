"""``kvarena conform --junit-xml FILE``: the report as JUnit XML, so CI systems show it natively.

One test case per vector file (failed, skipped when it stopped early at ``safety``, passed) and one per
invariant ID of the lockstep machine run (failed when the machine's divergence names it, skipped when no
step could have broken it), plus ``machine.divergence`` for a machine divergence that names no invariant,
``coverage.vacuity`` for a run that exercised nothing and ``coverage.thin`` for a PASS on fewer completed
vector files than ``--min-completed`` (both exit 3).  A failure's message starts with the invariant it
breaks, or VACUOUS / THIN.  The suite's properties carry the verdict (``result``: PASS, THIN, VACUOUS,
FAIL), what it stands on (``basis``, ``vectors_completed``) and the coverage counters.  Broken input (exit 2:
an adapter that cannot load, a malformed vector file) is one test case with an ``<error>`` (:func:`write_error`).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from kvarena.conformance.machine.coverage import EXPOSURE


def _case(suite: ET.Element, classname: str, name: str, seconds: float = 0.0) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")


def to_xml(report: Any) -> ET.ElementTree:
    """The JUnit tree of a :class:`kvarena.conformance.runner.conform.Report`."""
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=f"kvarena-conform[{report.impl}@{report.level}]",
                          time=f"{report.seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    done, stopped, _ = report.vector_counts()
    for key, value in (("result", report.verdict), ("exit_code", str(report.exit_code)), ("basis", report.basis()),
                       ("vectors_completed", f"{done} of {len(report.vectors)}"),
                       ("vectors_stopped_early", str(stopped)), *(("protocol", n) for n in report.protocol_notes)):
        ET.SubElement(props, "property", name=key, value=value)
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
                ET.SubElement(case, "failure", message=f"{inv}: {_first(report.machine_message)}"[:500],
                              type=inv).text = report.machine_message
            elif not exposure.get(inv, 0):
                skipped += 1
                ET.SubElement(case, "skipped", message=f"no machine step could have broken {inv}")
        if report.machine_status == "failed" and report.machine_inv not in EXPOSURE:
            case = _case(suite, "kvarena.machine", "divergence")
            tests += 1
            failures += 1
            ET.SubElement(case, "failure", message=_first(report.machine_message)[:500],
                          type="divergence").text = report.machine_message
    if report.ok and report.vacuous:
        case = _case(suite, "kvarena.coverage", "vacuity")
        tests += 1
        failures += 1
        ET.SubElement(case, "failure", message=f"VACUOUS: {report.vacuous}"[:500], type="vacuous").text = \
            report.vacuous
    if report.thin:
        case = _case(suite, "kvarena.coverage", "thin")
        tests += 1
        failures += 1
        ET.SubElement(case, "failure", message=f"THIN: {report.thin}"[:500], type="thin").text = report.thin
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    return ET.ElementTree(suites)


def _first(message: str) -> str:
    return (message.splitlines() or [""])[0]


def error_xml(impl: str, level: str, message: str) -> ET.ElementTree:
    """Broken input as JUnit: one test case with an ``<error>``, so CI shows why nothing ran (not a green 0)."""
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=f"kvarena-conform[{impl}@{level}]", tests="1", failures="0",
                          errors="1", skipped="0", time="0.000")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="result", value="BROKEN")
    ET.SubElement(props, "property", name="exit_code", value="2")
    case = _case(suite, "kvarena.adapter", "load")
    ET.SubElement(case, "error", message=message[:500], type="broken-input").text = message
    return ET.ElementTree(suites)


def _save(tree: ET.ElementTree, path: Path | str) -> None:
    ET.indent(tree)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def write(report: Any, path: Path | str) -> None:
    _save(to_xml(report), path)


def write_error(path: Path | str, impl: str, level: str, message: str) -> None:
    """The JUnit file of a run that could not start (exit 2): the adapter, a vector file or the arguments."""
    _save(error_xml(impl, level, message), path)
