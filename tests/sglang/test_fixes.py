"""The fixes in docs/sglang-fixes/ (one per finding of docs/sglang-findings.md) applied to a copy of the installed
SGLang 0.5.23: each finding's strict xfail in test_sglang_conformance.py then passes, and with all five applied
the rest of that file stays green.

How: an overlay of the installed ``sglang`` package in a tmp dir (every entry a symlink to the wheel's, except the
directories down to the patched file and the file itself, a copy), the patch applied with ``git apply -p2`` (or
``patch -p2``; the files are written for ``-p1`` on an SGLang checkout, whose package lives under ``python/``), and
pytest run in a SUBPROCESS with the overlay first on ``PYTHONPATH`` and ``--runxfail`` (the xfail markers are
ignored, so a finding's test must pass outright).  This process keeps the unpatched SGLang.  The subprocess first
asserts that the allocator it loaded is the patched copy.

Deselected in the all-patches run: ``test_double_free_consequences``, which asserts what the double frees of
findings 1 and 2 lead to (a -1 in the free list, a parked float overwritten); with the fixes, the double free is
refused and those consequences are gone.  Every other test of the file runs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
FIXES = REPO / "docs" / "sglang-fixes"
FINDINGS = REPO / "docs" / "sglang-findings.md"
SUITE = "tests/sglang/test_sglang_conformance.py"
PATCHES = sorted(FIXES.glob("[0-9][0-9]-*.patch"))
# The finding each patch fixes -> the strict xfails of test_sglang_conformance.py it must turn into passes.
XFAILS = {
    1: (["test_double_free_on_a_lazy_end_is_refused"], 3),
    2: (["test_double_free_on_a_float_is_refused"], 1),
    3: (["test_lazy_take_physical_stops_at_an_off_grid_neighbour"], 1),
    4: (["test_eager_take_physical_stops_at_the_neighbour"], 1),
    5: (["test_a_move_cap_of_zero_moves_nothing"], 1),
}
CONSEQUENCES = "test_double_free_consequences"  # asserts the bugs' effects (see the module docstring)

_spec = importlib.util.find_spec("sglang")
if _spec is None or not _spec.submodule_search_locations:  # pragma: no cover - depends on the machine
    pytest.skip("SGLang is not installed; run `make sglang` or `tox -e sglang`", allow_module_level=True)
SGLANG = Path(next(iter(_spec.submodule_search_locations)))  # the installed package dir
TOOL = shutil.which("git") or shutil.which("patch")


def number(patch: Path) -> int:
    return int(patch.name[:2])


def targets(patch: Path) -> list[str]:
    """The files a patch changes, relative to the ``sglang`` package dir."""
    out = re.findall(r"^\+\+\+ b/python/sglang/(\S+)", patch.read_text(), flags=re.M)
    assert out, f"{patch.name} changes no file under python/sglang/"
    return out


def overlay(root: Path, rels: list[str]) -> Path:
    """``root/sglang``: the installed package, symlinked entry by entry, with a real copy of each file in ``rels``
    (and real directories down to it) so a patch changes only the copy."""
    for rel in rels:
        here, src = root / "sglang", SGLANG
        for part in Path(rel).parts:
            if here.is_symlink():  # a sibling linked earlier: make it a real directory
                here.unlink()
            if not here.exists():
                here.mkdir(parents=True)
                for entry in src.iterdir():
                    if entry.name != "__pycache__":
                        (here / entry.name).symlink_to(entry)
            here, src = here / part, src / part
        here.unlink()
        shutil.copyfile(src, here)
    return root / "sglang"


def apply(root: Path, patches: list[Path]) -> None:
    if TOOL is None:
        pytest.skip("neither git nor patch is installed")
    for p in patches:
        cmd = ["git", "apply", "-p2", str(p)] if TOOL.endswith("git") else ["patch", "-p2", "-s", "-i", str(p)]
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        assert r.returncode == 0, f"{p.name} does not apply to sglang {_version()}: {r.stdout}{r.stderr}"


def _version() -> str:
    return importlib.metadata.version("sglang")


BOOT = """
import sys, pytest
from kvarena.engines.sglang import adapter as sga
alloc = sga.load_sglang().alloc.__file__
assert alloc.startswith(sys.argv[1]), f"loaded {alloc}, not the patched copy under {sys.argv[1]}"
sys.exit(pytest.main(sys.argv[2:]))
"""


def run_patched(root: Path, args: list[str]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    cmd = [sys.executable, "-c", BOOT, str(root), "-q", "-p", "no:cacheprovider", "--runxfail",
           # kvarena (a pytest11 plugin) is imported by the boot code before pytest starts
           "-W", "ignore::pytest.PytestAssertRewriteWarning", *args]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def summary(out: str) -> str:
    """pytest's last line (``N passed, M deselected in T s``)."""
    lines = [ln for ln in out.splitlines() if re.search(r" in [\d.]+s", ln)]
    return lines[-1] if lines else ""


def count(out: str, what: str) -> int:
    m = re.search(rf"(\d+) {what}", summary(out))
    return int(m.group(1)) if m else 0


def test_one_patch_per_finding() -> None:
    """Every finding of docs/sglang-findings.md has its patch, each with a header saying what it fixes, and the
    patches change only the 0.5.23 files the findings name."""
    assert _version() == "0.5.23", f"the patches are against sglang 0.5.23, {_version()} is installed"
    findings = [int(n) for n in re.findall(r"^### (\d+)\. ", FINDINGS.read_text(), flags=re.M)]
    assert findings == sorted(XFAILS) == [number(p) for p in PATCHES], (findings, [p.name for p in PATCHES])
    readme = (FIXES / "README.md").read_text()
    for p in PATCHES:
        head = p.read_text().split("\n--- a/", 1)[0]
        assert head.startswith(f"Fix for finding {number(p)} of docs/sglang-findings.md"), p.name
        assert p.name in readme, f"docs/sglang-fixes/README.md does not list {p.name}"
        assert targets(p) == ["srt/mem_cache/allocator/unified_sub_pool.py"], p.name
        for name in XFAILS[number(p)][0]:
            assert f"def {name}(" in (REPO / SUITE).read_text()


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name[:2] for p in PATCHES])
def test_each_patch_alone_turns_its_xfail_into_a_pass(patch: Path, tmp_path: Path) -> None:
    overlay(tmp_path, targets(patch))
    apply(tmp_path, [patch])
    names, n = XFAILS[number(patch)]
    rc, out = run_patched(tmp_path, [SUITE, "-k", " or ".join(names)])
    assert rc == 0 and count(out, "passed") == n, f"{patch.name}: expected {n} passed\n{out[-4000:]}"


def test_without_a_patch_the_findings_fail(tmp_path: Path) -> None:
    """The control: the same overlay, unpatched, under ``--runxfail``: every finding's test fails."""
    overlay(tmp_path, ["srt/mem_cache/allocator/unified_sub_pool.py"])
    rc, out = run_patched(tmp_path, [SUITE, "-k", " or ".join(n for names, _c in XFAILS.values() for n in names)])
    n = sum(c for _names, c in XFAILS.values())
    assert rc == 1 and count(out, "failed") == n and not count(out, "passed"), out[-4000:]


def test_all_patches_keep_the_suite_green(tmp_path: Path) -> None:
    overlay(tmp_path, sorted({t for p in PATCHES for t in targets(p)}))
    apply(tmp_path, PATCHES)
    rc, out = run_patched(tmp_path, [SUITE, "-m", "sglang and not slow", "--deselect", f"{SUITE}::{CONSEQUENCES}"])
    n = sum(c for _names, c in XFAILS.values())
    assert rc == 0 and not re.search(r"failed|error|xfail|skipped", summary(out)), out[-4000:]
    assert count(out, "passed") >= n + 1, out[-4000:]
    print(f"\nall {len(PATCHES)} patches: {summary(out).strip(' =')}", file=sys.stderr)
