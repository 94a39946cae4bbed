"""``kvarena conform`` / ``kvarena vectors`` and the pytest plugin: exit codes, messages, help."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvarena.conformance.adapter.protocol as adapter
from kvarena.cli import main
from kvarena.conformance.adapter.renumbered import Renumbered
from kvarena.conformance.vectors.replay import VECTOR_DIR
from kvarena.reference.arena import Arena
from kvarena.spec.models import ArenaConfig

ONE = str(VECTOR_DIR / "errors-every-code.jsonl")
ME = __name__


# -- adapters with defects (named by --impl f"{ME}:<name>") ------------------------------------


class _Partial:
    def __init__(self, config: ArenaConfig) -> None:
        self.inner = Arena(config)
        self.order = self.inner.order

    def __getattr__(self, name: str) -> Any:  # the protocol's methods but release, translate and observe
        if name in ("admit", "extend", "share", "drop", "slide", "free", "acquire", "compact", "relayout", "write",
                    "read"):
            return getattr(self.inner, name)
        raise AttributeError(name)


def missing_methods(config: ArenaConfig) -> Any:
    return _Partial(config)


def raises(config: ArenaConfig) -> Any:
    raise RuntimeError("CUDA driver not found")


def wrong_free(config: ArenaConfig) -> Any:
    a = Renumbered(config)
    a.free = lambda owner: {"freed": 3}  # type: ignore[method-assign]
    return a


def leaks_on_free(config: ArenaConfig) -> Any:
    """Frees nothing: a real divergence, not an adapter problem."""
    a = Renumbered(config)
    inner_free = a.inner.free

    def free(owner: str) -> list[int]:
        pages = [v for vs in a.inner.held(owner).values() for v in vs]
        inner_free(owner)
        return [a.out(v) for v in pages[:-1]] if pages else []

    a.free = free  # type: ignore[method-assign]
    return a


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- the command ----------------------------------------------------------------------------------


def test_conform_reference_exits_0(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", "reference", "--examples", "10")
    assert code == 0, out
    n = len(list(VECTOR_DIR.glob("*.jsonl")))
    assert f"vectors: {n} passed, 0 failed" in out and "machine: passed" in out and "result: PASS at level exact" in out


def test_conform_renumbered_passes_decisions_fails_exact(capsys: pytest.CaptureFixture) -> None:
    impl = "kvarena.conformance.adapter.renumbered:renumbered"
    code, out, _ = _run(capsys, "conform", "--impl", impl, "--level", "decisions", "--vectors", ONE, "--examples", "5")
    assert code == 0, out
    code, out, _ = _run(capsys, "conform", "--impl", impl, "--level", "exact", "--vectors", ONE, "--examples", "0")
    assert code == 1, out
    assert "DIVERGENCE in vector errors-every-code.jsonl" in out and "returned virtual ids" in out
    assert "errors-every-code.jsonl:2: step 1 at level exact" in out
    assert '"op": "admit"' in out  # the trace that led there
    assert "result: FAIL" in out


def test_divergence_prints_the_shrunk_machine_trace(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(capsys, "conform", "--impl", f"{ME}:leaks_on_free", "--level", "safety", "--vectors", "none",
                        "--examples", "50")
    assert code == 1, out
    # the boundary scenarios run first and catch it; either way the trace to replay is printed
    assert ("DIVERGENCE in a boundary scenario" in out or "DIVERGENCE in the lockstep machine" in out) \
        and "freed logical pages" in out
    assert "trace (JSON lines" in out


@pytest.mark.parametrize(("impl", "words"), [
    (f"{ME}:missing_methods", "lacks release(), translate(), observe()"),
    (f"{ME}:raises", "raised RuntimeError: CUDA driver not found"),
    (f"{ME}:wrong_free", "free() returned {'freed': 3}: expected the freed virtual ids"),
    (f"{ME}:nothing_here", "has no attribute 'nothing_here'"),
    ("no_such_package.mod:make", "cannot import 'no_such_package.mod'"),
    ("not-a-spec", "expected package.module:factory"),
])
def test_broken_adapter_exits_2_and_names_the_problem(capsys: pytest.CaptureFixture, impl: str, words: str) -> None:
    code, out, err = _run(capsys, "conform", "--impl", impl, "--level", "decisions", "--vectors", ONE,
                          "--examples", "3")
    assert code == 2, out + err
    assert "kvarena conform: broken adapter:" in err and words in err, err


def test_missing_gpu_is_said_clearly(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "DEFAULT_IMPL", "kvarena.gpu.not_there_yet:make")
    code, _, err = _run(capsys, "conform", "--examples", "0")
    assert code == 2
    assert "kvarena's own gpu/ implementation is not there yet" in err and "--impl reference" in err, err


def test_malformed_vector_exits_2_naming_file_and_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    lines = Path(ONE).read_text().splitlines()
    lines[5] = lines[5].replace('"op":', '"opp":', 1)
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = _run(capsys, "conform", "--impl", "reference", "--vectors", str(tmp_path), "--examples", "0")
    assert code == 2
    assert f"broken vector file: {tmp_path / 'bad.jsonl'}:6: unknown op None" in err, err


def test_help_teaches(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["conform", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for words in ("safety", "decisions", "exact", "--impl", "engine's CI", "pytest --kvarena-impl", "exit status"):
        assert words in out, words
    with pytest.raises(SystemExit) as info:
        main(["vectors", "--help"])
    assert info.value.code == 0
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "kvarena conform" in out and "kvarena vectors" in out


def test_console_script_help() -> None:
    exe = shutil.which("kvarena", path=os.path.dirname(sys.executable)) or "kvarena"
    r = subprocess.run([exe, "conform", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "levels" in r.stdout, r.stderr


# -- kvarena vectors --------------------------------------------------------------------------------


def test_vectors_check_and_list(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "vectors", "--check")
    assert code == 0 and "every vector matches the reference" in out
    code, out, _ = _run(capsys, "vectors", "--list")
    assert code == 0 and "sglang-double-free.jsonl" in out
    shutil.copytree(VECTOR_DIR, tmp_path / "v")
    f = tmp_path / "v" / "rung2-compact.jsonl"
    lines = f.read_text().splitlines()
    lines[7] = lines[7].replace('"rung":', '"rung" :', 1)
    f.write_text("\n".join(lines) + "\n")
    (tmp_path / "v" / "stale.jsonl").write_text("{}\n")
    code, _, err = _run(capsys, "vectors", "--check", "--dir", str(tmp_path / "v"))
    assert code == 1
    assert "rung2-compact.jsonl: differs from the reference at line 8" in err and "stale.jsonl" in err, err
    code, out, _ = _run(capsys, "vectors", "--write", "--dir", str(tmp_path / "v"))
    assert code == 0 and not (tmp_path / "v" / "stale.jsonl").exists()
    assert _run(capsys, "vectors", "--check", "--dir", str(tmp_path / "v"))[0] == 0


# -- the pytest plugin --------------------------------------------------------------------------------


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_engine.py").write_text("def test_engine_own():\n    assert True\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path), *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_plugin_is_inert_without_the_option(tmp_path: Path) -> None:
    r = _pytest(tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_plugin_runs_the_suite(tmp_path: Path) -> None:
    r = _pytest(tmp_path, "--kvarena-impl=reference", f"--kvarena-vectors={ONE}", "--kvarena-examples=5")
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr
    r = _pytest(tmp_path, "--kvarena-impl=kvarena.conformance.adapter.renumbered:renumbered", "--kvarena-level=exact",
                f"--kvarena-vectors={ONE}", "--kvarena-examples=0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kvarena-conformance[kvarena.conformance.adapter.renumbered:renumbered@exact]" in r.stdout
    assert "DIVERGENCE in vector errors-every-code.jsonl" in r.stdout


def test_plugin_imports_the_adapter_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "engine_adapter.py").write_text("from kvarena.conformance.example.adapter import make\n")
    r = _pytest(tmp_path, "--kvarena-impl=engine_adapter:make", f"--kvarena-vectors={ONE}", "--kvarena-examples=5")
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr
    r = _pytest(tmp_path, "--collect-only", "--kvarena-impl=engine_adapter:make")
    assert "kvarena-conformance[engine_adapter:make@safety]" in r.stdout, r.stdout  # third party: safety by default
