"""kvarena as others install it: the wheel's contents, the extras, and three installs into fresh venvs.

The fast checks read files. The ``install`` tests build venvs and pip-install into them (pip's package index
must be reachable; ``-m "not install"`` skips them offline); each builds its own venv (~10 s), so under
``-n 2`` they spread over both workers:

* the built wheel, first with no extra (core commands run, ``conform`` names its missing extra in one line),
  then with ``[conform]``: ``kvarena conform --impl reference`` passes and the spec / vectors are installed;
* ``pip install ".[conform]"`` from a source tree, then ``kvarena conform --impl reference``;
* docs/ci-step.sh, verbatim, installing from a ``git+file://`` URL under the oldest and the newest pip docs/ci.md
  supports (each from the package index): the reference passes and its JUnit file parses; the worked example's
  planted bug exits 1 with a failure in the JUnit file.

All three install from a clean copy of the working tree (tracked and untracked, not ignored, files), so what
is tested is what is about to be committed, and setuptools' build/ never sees a stale file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from kvarena.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
CI_STEP = ROOT / "docs" / "ci-step.sh"
TIMEOUT = 300  # per subprocess; a cold pip cache in CI is the slow part

tomllib = pytest.importorskip("tomllib")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


# ----- fast: what the files promise -----

def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_every_extra_is_pinned_for_ci() -> None:
    """`make test` installs requirements-ci.txt (+ the SGLang and vLLM pins); every extra's package is pinned there, so
    CI tests what the extras promise."""
    pins = {_requirement_name(line) for line in (ROOT / "requirements-ci.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    for var in ("SGLANG_PINS", "VLLM_PINS"):
        pins |= {_requirement_name(p) for p in re.search(rf"^{var} := (.*)$", (ROOT / "Makefile").read_text(),
                                                         re.M).group(1).split()}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"conform", "proofs", "gpu", "plot", "sglang", "test", "all"} <= set(extras)
    for extra, reqs in extras.items():
        for req in reqs:
            name = _requirement_name(req)
            if name == "kvarena":
                inner = set(re.search(r"\[(.*)\]", req).group(1).split(","))
                assert inner <= set(extras), f"{extra}: {req} names an extra that does not exist"
            else:
                assert name in pins, f"extra {extra!r}: {name} has no pin in requirements-ci.txt or SGLANG_PINS"
    everything = set(re.search(r"\[(.*)\]", extras["all"][0]).group(1).split(","))
    assert everything == set(extras) - {"all"}, "kvarena[all] must name every other extra"


def test_every_package_folder_is_packaged() -> None:
    """Every folder with an __init__.py under a mapped top-level folder is in `packages`, and every top-level
    Python package (but tests/) is mapped: a new subpackage cannot be left out of the wheel."""
    mapping = SETUPTOOLS["package-dir"]
    listed = set(SETUPTOOLS["packages"])
    for package, folder in mapping.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts])
            assert name in listed, f"{init.parent.relative_to(ROOT)} ({name}) is missing from packages"
    for init in sorted(ROOT.glob("*/__init__.py")):
        folder = init.parent.name
        if folder != "tests":
            assert folder in mapping.values(), f"{folder}/ is a package but not in package-dir"


def _sh_block_after(text: str, marker: str, lang: str) -> str:
    start = text.index(marker)
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(text, start)
    assert m, f"no ```{lang} block after {marker!r}"
    return m.group(1)


def test_ci_md_shows_the_step_verbatim() -> None:
    """docs/ci.md includes docs/ci-step.sh byte for byte, and the Actions job runs the same two commands."""
    text = (ROOT / "docs" / "ci.md").read_text()
    script = CI_STEP.read_text()
    assert _sh_block_after(text, "## The shell step", "sh") == script
    commands = [line for line in script.splitlines() if line.startswith(("python -m pip", "kvarena "))]
    assert len(commands) == 2
    job = _sh_block_after(text, "## GitHub Actions", "yaml")
    for command in commands:
        assert f"          {command}\n" in job, command
    assert "upload-artifact" in job and "if: always()" in job


BARE_INSTALL = re.compile(r"pip install\s+['\"]?kvarena(\[[^\]]*\])?['\"]?(?!\s*@)(\s|$)")


def test_docs_never_say_pip_install_kvarena() -> None:
    """kvarena is not on the package index: a bare `pip install kvarena` would install someone else's."""
    docs = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/README.md")]
    for doc in docs:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            assert not BARE_INSTALL.search(line), f"{doc.name}:{n}: {line}"


# ----- install: fresh venvs -----

def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True
         ) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {r.returncode}\n{r.stdout[-3000:]}\n"
                             f"{r.stderr[-3000:]}")
    return r


def _venv(path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh venv with nothing in it but pip; its bin/ and an environment that runs it (not .venv)."""
    _run([sys.executable, "-m", "venv", str(path)], cwd=path.parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return path / "bin", env


@pytest.fixture(scope="session")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean copy of the working tree, committed in a git repository of its own (for git+file://)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ls = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                        capture_output=True)
    if ls.returncode != 0:
        pytest.skip("not a git checkout: nothing to copy")
    dest = tmp_path_factory.mktemp("src") / "kvarena"
    for rel in filter(None, ls.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=kvarena-test", "-c", "user.email=test@kvarena.invalid", "-c",
           "init.defaultBranch=main", "-c", "commit.gpgsign=false"]
    _run([*git, "init", "-q"], cwd=dest)
    _run([*git, "add", "-A"], cwd=dest)
    _run([*git, "commit", "-q", "-m", "snapshot of the working tree"], cwd=dest)
    return dest


@pytest.fixture(scope="session")
def wheel(source_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    tree = out / "tree"
    shutil.copytree(source_tree, tree, ignore=shutil.ignore_patterns(".git"))  # the build writes into its tree
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(tree)], cwd=out)
    wheels = list(out.glob("kvarena-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _data_files(root: Path) -> set[str]:
    """What `conform` and the reader need besides code, as paths inside the installed package."""
    mapping = {folder: package for package, folder in SETUPTOOLS["package-dir"].items()}
    files = {"spec/arena.md", "conformance/vectors/FORMAT.md", "conformance/CHANGELOG.md",  # conform's warnings cite it
             *(f"conformance/vectors/{p.name}" for p in (root / "conformance" / "vectors").glob("*.jsonl"))}
    return {"/".join([*mapping[f.split("/")[0]].split("."), *f.split("/")[1:]]) for f in files}


@pytest.mark.install
def test_wheel_carries_code_spec_and_vectors(wheel: Path, source_tree: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    data = _data_files(source_tree)
    assert len(data) > 10
    assert data <= names, sorted(data - names)
    for package, folder in SETUPTOOLS["package-dir"].items():
        for py in (source_tree / folder).rglob("*.py"):
            inside = "/".join([*package.split("."), *py.relative_to(source_tree / folder).parts])
            assert inside in names, f"{py.relative_to(source_tree)} is not in the wheel"


@pytest.mark.install
def test_wheel_in_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    """The wheel alone runs the core commands and names the missing extra; with [conform], conform passes."""
    bin_, env = _venv(tmp_path / "venv")
    work = tmp_path / "elsewhere"  # not the source tree: only the installed package can import
    work.mkdir()
    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=work, env=env)
    for command in (None, *COMMANDS):  # the real thing test_cli.py simulates with an import hook
        _run([str(bin_ / "kvarena"), *([command] if command else []), "--help"], cwd=work, env=env)
    assert "gpt-oss-20b" in _run([str(bin_ / "kvarena"), "models"], cwd=work, env=env).stdout
    for argv, extra in ((["conform", "--impl", "reference", "--examples", "5"], "conform"),
                        (["prove", "--no-ladder"], "proofs")):
        r = _run([str(bin_ / "kvarena"), *argv], cwd=work, env=env, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"kvarena {argv[0]} needs the '{extra}' extra" in r.stderr.strip().splitlines()[-1], r.stderr

    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", f"{wheel}[conform]"], cwd=work, env=env)
    r = _run([str(bin_ / "kvarena"), "conform", "--impl", "reference", "--examples", "5"], cwd=work, env=env)
    assert "PASS" in r.stdout, r.stdout
    site = _run([str(bin_ / "python"), "-c", "import kvarena, pathlib; print(pathlib.Path(kvarena.__file__).parent)"],
                cwd=work, env=env).stdout.strip()
    package_root = Path(site).parent
    assert str(package_root).startswith(str(tmp_path)), package_root
    for rel in _data_files(Path(wheel.parent / "tree")):
        assert (package_root / rel).is_file(), rel


@pytest.mark.install
def test_source_install_with_the_conform_extra(source_tree: Path, tmp_path: Path) -> None:
    """Issue 10's check, literally: `pip install ".[conform]"` in an empty venv, then conform."""
    tree = tmp_path / "kvarena"
    shutil.copytree(source_tree, tree, ignore=shutil.ignore_patterns(".git"))
    bin_, env = _venv(tmp_path / "venv")
    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", ".[conform]"], cwd=tree, env=env)
    r = _run([str(bin_ / "kvarena"), "conform", "--impl", "reference"], cwd=tmp_path, env=env)
    assert "PASS" in r.stdout, r.stdout


# The pip versions docs/ci.md promises: 23.2.1 (Python 3.11's bundled pip; its URL parser refuses git+file:///)
# and the newest tested. Each is installed from the package index, so the test does not depend on the venv's own.
PIP_OLDEST, PIP_NEWEST = "23.2.1", "26.3"


@pytest.mark.install
@pytest.mark.parametrize("pip_version", [PIP_OLDEST, PIP_NEWEST])
def test_ci_step_runs_verbatim(source_tree: Path, tmp_path: Path, pip_version: str) -> None:
    """docs/ci-step.sh as an engine's CI runs it: kvarena from a git URL, conform, a JUnit file that parses."""
    bin_, env = _venv(tmp_path / "venv")
    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", f"pip=={pip_version}"], cwd=tmp_path, env=env)
    got = _run([str(bin_ / "python"), "-m", "pip", "--version"], cwd=tmp_path, env=env).stdout
    assert got.startswith(f"pip {pip_version} "), got
    engine = tmp_path / "engine"  # the engine's checkout: the step runs there
    engine.mkdir()
    sha = _run(["git", "rev-parse", "HEAD"], cwd=source_tree).stdout.strip()
    if pip_version == PIP_OLDEST:
        # the form docs/ci.md warns about: pip < 24.1 refuses it (no host) ...
        r = _run([str(bin_ / "python"), "-m", "pip", "install", "-q", f"kvarena @ git+file://{source_tree}"],
                 cwd=engine, env=env, check=False)
        assert r.returncode != 0 and "Invalid requirement" in r.stderr, r.stderr[-2000:]
        src = f"git+file://{source_tree}"  # ... and the step rewrites it to file://localhost/
    else:
        src = f"git+file://localhost{source_tree}@{sha}"  # the documented form, pinned to a commit
    env.update(KVARENA_SRC=src, KVARENA_IMPL="reference")
    r = _run(["bash", str(CI_STEP)], cwd=engine, env=env)
    assert "PASS" in r.stdout, r.stdout
    report = engine / "kvarena.xml"
    assert report.is_file(), "the step wrote no JUnit file"
    root = ET.parse(report).getroot()
    cases = root.findall(".//testcase")
    assert root.tag in ("testsuites", "testsuite") and cases, ET.tostring(root)[:500]
    assert not root.findall(".//failure") and not root.findall(".//error")
    # a violation fails the step (exit 1) and lands in the JUnit file: the worked example's planted bug
    env["KVARENA_IMPL"] = "kvarena.conformance.example.adapter:make_buggy"
    report.unlink()
    r = _run(["bash", str(CI_STEP)], cwd=engine, env=env, check=False)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert ET.parse(report).getroot().findall(".//failure"), "the violation is not in the JUnit file"
    # KVARENA_SRC is required: without it the step stops before installing anything
    del env["KVARENA_SRC"]
    r = _run(["bash", str(CI_STEP)], cwd=engine, env=env, check=False)
    assert r.returncode != 0 and "set KVARENA_SRC" in r.stderr


def test_bare_install_pattern() -> None:
    for bad in ("pip install kvarena", "pip install 'kvarena[conform]'", 'pip install "kvarena" && x'):
        assert BARE_INSTALL.search(bad), bad
    for good in ('pip install "kvarena[conform] @ git+https://x/kvarena@v1"', "pip install kvarena-foo",
                 "pip install '.[conform]'"):
        assert not BARE_INSTALL.search(good), good
