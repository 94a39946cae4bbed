"""What a conform verdict stands on, and input that cannot run: the result line's basis, ``--min-completed`` (a thin
PASS exits 3), JUnit and the pytest plugin telling violating, vacuous and thin runs apart, adapters that cannot
load (one line naming the module and the error, exit 2, a JUnit error), and no ``.hypothesis/`` left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvarena.cli import main
from kvarena.conformance.vectors.replay import VECTOR_DIR

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "kvarena.conformance.example.adapter"
VACUOUS = "tests.fast.test_conform_coverage:refuses_everything"  # checks arguments, then refuses every admission
# The worked example completes the first two and stops early in the third (an admission its pool refuses).
SUBSET = ("sglang-unit-lazy-free.jsonl", "sglang-unit-multi-ended.jsonl", "rung2-compact.jsonl")
RESULT = re.compile(r"result: (\w+) at level safety \(2 of 3 vectors completed, 1 stopped early; [\d,]+ boundary "
                    r"scenarios, [\d,]+ machine examples; [\d,]+ admissions accepted, [\d,]+ pages placed, [\d,]+ "
                    r"moved; [\d.]+ s\)")


@pytest.fixture
def subset(tmp_path: Path) -> Path:
    d = tmp_path / "vectors"
    d.mkdir()
    for name in SUBSET:
        shutil.copy(VECTOR_DIR / name, d / name)
    return d


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _suite(path: Path) -> tuple[ET.Element, dict[str, str]]:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return suite, {p.get("name", ""): p.get("value", "") for p in suite.iter("property")}


# -- the result line and --min-completed ---------------------------------------------------------------


def test_the_result_line_says_what_a_pass_stands_on(capsys: pytest.CaptureFixture, subset: Path) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", f"{EXAMPLE}:make", "--vectors", str(subset), "--examples", "3",
                        "-q")
    assert code == 0, out
    m = RESULT.fullmatch(out.strip().splitlines()[-1])
    assert m and m.group(1) == "PASS", out.strip().splitlines()[-1]


def test_min_completed_turns_a_thin_pass_into_exit_3(capsys: pytest.CaptureFixture, subset: Path,
                                                     tmp_path: Path) -> None:
    xml = tmp_path / "k.xml"
    argv = ("conform", "--impl", f"{EXAMPLE}:make", "--vectors", str(subset), "--examples", "0", "-q")
    assert _run(capsys, *argv, "--min-completed", "2")[0] == 0  # exactly enough
    code, out, _ = _run(capsys, *argv, "--min-completed", "3", "--junit-xml", str(xml))
    assert code == 3, out
    assert "THIN: 2 of 3 vector files completed (1 stopped early), fewer than --min-completed 3" in out
    assert out.strip().splitlines()[-1].startswith("result: THIN at level safety (2 of 3 vectors completed, 1 stopped "
                                                   "early; machine not run; "), out
    suite, props = _suite(xml)
    assert props["result"] == "THIN" and props["exit_code"] == "3" and props["vectors_completed"] == "2 of 3"
    thin = [c for c in suite.iter("testcase") if (c.get("classname"), c.get("name")) == ("kvarena.coverage", "thin")]
    assert len(thin) == 1 and thin[0].find("failure").get("message", "").startswith("THIN: 2 of 3")
    code, out, _ = _run(capsys, *argv, "--min-completed", "3", "--json")
    data = json.loads(out)
    assert code == 3 and data["result"] == "THIN" and data["exit_code"] == 3 and data["thin"].startswith("2 of 3")


def test_min_completed_below_zero_is_broken_input(capsys: pytest.CaptureFixture) -> None:
    code, _, err = _run(capsys, "conform", "--impl", "reference", "--min-completed", "-1")
    assert code == 2 and "--min-completed must be >= 0" in err and len(err.strip().splitlines()) == 1, err


def test_junit_tells_a_violation_and_a_vacuous_run_apart(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    xml = tmp_path / "fail.xml"
    code, _, _ = _run(capsys, "conform", "--impl", f"{EXAMPLE}:make_buggy", "--vectors",
                      str(VECTOR_DIR / "mixed-toy-swa.jsonl"), "--examples", "30", "-q", "--junit-xml", str(xml))
    assert code == 1
    suite, props = _suite(xml)
    assert props["result"] == "FAIL"
    messages = [f.get("message", "") for f in suite.iter("failure")]
    assert messages and all(m.startswith("INV-NO-OVERLAP: ") for m in messages), messages
    xml = tmp_path / "vacuous.xml"
    code, _, _ = _run(capsys, "conform", "--impl", VACUOUS, "--examples", "5", "-q", "--junit-xml", str(xml))
    assert code == 3
    suite, props = _suite(xml)
    assert props["result"] == "VACUOUS"
    (failure,) = list(suite.iter("failure"))
    assert failure.get("type") == "vacuous" and failure.get("message", "").startswith("VACUOUS: ")


# -- adapters that cannot load ----------------------------------------------------------------------------

UNLOADABLE = [
    ("def make(config)\n    return None\n", "SyntaxError: expected ':'"),
    ("raise RuntimeError('no CUDA driver\\nfound')\n", "raised RuntimeError: no CUDA driver found (at "),
    ("import kvarena_test_not_installed\n", "ModuleNotFoundError: No module named 'kvarena_test_not_installed'"),
    ("def make(config):\n    raise ValueError('bad\\nconfig')\n", ":make raised ValueError: bad config (at "),
]


@pytest.mark.parametrize(("i", "source", "words"), [(i, s, w) for i, (s, w) in enumerate(UNLOADABLE)])
def test_an_adapter_that_cannot_load_is_one_line_exit_2_and_a_junit_error(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, i: int, source: str,
        words: str) -> None:
    module = f"kvarena_test_unloadable_{i}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    xml = tmp_path / "k.xml"
    code, out, err = _run(capsys, "conform", "--impl", f"{module}:make", "--examples", "3", "-q",
                          "--junit-xml", str(xml))
    assert code == 2 and out == "", out
    (line,) = err.strip().splitlines()
    assert line.startswith("kvarena conform: broken adapter: ") and module in line and words in line, line
    assert "Traceback" not in err
    suite, props = _suite(xml)
    assert props["result"] == "BROKEN" and suite.get("errors") == "1" and suite.get("failures") == "0"
    (error,) = list(suite.iter("error"))
    assert error.get("message") == line.removeprefix("kvarena conform: ")


def test_a_malformed_vector_is_a_junit_error_too(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    xml = tmp_path / "k.xml"
    code, _, err = _run(capsys, "conform", "--impl", "reference", "--vectors", str(tmp_path), "--examples", "0",
                        "--junit-xml", str(xml))
    assert code == 2 and "broken vector file" in err
    (error,) = list(_suite(xml)[0].iter("error"))
    assert "bad.jsonl" in error.get("message", "")


# -- the pytest plugin --------------------------------------------------------------------------------------


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_engine.py").write_text("def test_engine_own():\n    assert True\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_engine.py"), *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)


def test_the_plugin_tells_a_thin_pass_from_a_plain_one(tmp_path: Path, subset: Path) -> None:
    xml = tmp_path / "suite.xml"
    args = (f"--kvarena-impl={EXAMPLE}:make", f"--kvarena-vectors={subset}", "--kvarena-examples=3")
    r = _pytest(tmp_path, *args, f"--junit-xml={xml}")
    assert r.returncode == 0 and "2 passed, 1 warning" in r.stdout, r.stdout + r.stderr
    assert "1 vector files stopped early" in r.stdout and "2 of 3 vectors completed" in r.stdout, r.stdout
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).getroot().iter("property")}
    assert props["kvarena_result"] == "PASS" and props["kvarena_basis"].startswith("2 of 3 vectors completed")
    r = _pytest(tmp_path, *args, "--kvarena-min-completed=3")
    assert r.returncode == 1 and "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    assert "THIN at level safety: 2 of 3 vector files completed" in r.stdout, r.stdout


def test_the_plugin_names_the_invariant_or_the_vacuity(tmp_path: Path) -> None:
    r = _pytest(tmp_path, f"--kvarena-impl={EXAMPLE}:make_buggy",
                f"--kvarena-vectors={VECTOR_DIR / 'mixed-toy-swa.jsonl'}", "--kvarena-examples=0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL at level safety: INV-NO-OVERLAP in vector mixed-toy-swa.jsonl" in r.stdout, r.stdout
    r = _pytest(tmp_path, f"--kvarena-impl={VACUOUS}", "--kvarena-examples=3")
    assert r.returncode == 1 and "VACUOUS at level safety: the implementation accepted no admission" in r.stdout, \
        r.stdout
    r = _pytest(tmp_path, "--kvarena-impl=kvarena_test_no_such_engine:make")
    assert r.returncode == 1 and "broken adapter: cannot import 'kvarena_test_no_such_engine'" in r.stdout, r.stdout


# -- the engine's checkout stays clean -----------------------------------------------------------------------


def test_conform_leaves_no_hypothesis_directory_in_the_working_directory(tmp_path: Path) -> None:
    """Hypothesis caches under ./.hypothesis by default (its constants cache even with database=None): a fresh
    process, as in an engine's CI, wrote it into the engine's checkout before."""
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run([sys.executable, "-m", "kvarena", "conform", "--impl", "reference", "--vectors",
                        str(VECTOR_DIR / "errors-every-code.jsonl"), "--examples", "3", "-q"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "machine: passed" in r.stdout
    assert not (tmp_path / ".hypothesis").exists(), sorted(p.name for p in (tmp_path / ".hypothesis").rglob("*"))


def test_the_hypothesis_home_is_restored_after_the_run(tmp_path: Path) -> None:
    import hypothesis.configuration as hc

    from kvarena.conformance.runner.conform import hypothesis_home

    hc.set_hypothesis_home_dir(tmp_path / "mine")
    try:
        with hypothesis_home():
            inside = hc.storage_directory(intent_to_write=False).path
        assert inside != tmp_path / "mine" and not inside.exists()  # a temporary directory, removed after
        assert hc.storage_directory(intent_to_write=False).path == tmp_path / "mine"
    finally:
        hc.set_hypothesis_home_dir(None)
