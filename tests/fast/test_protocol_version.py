"""The adapter protocol's version: PROTOCOL_VERSION, PROTOCOL_CHANGES and conformance/CHANGELOG.md agree, and
``conform`` warns an adapter written for an older version, naming each change since."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvarena.cli import main
from kvarena.conformance.adapter import protocol
from kvarena.conformance.adapter.protocol import PROTOCOL_CHANGES, declared_version, version_notes
from kvarena.conformance.adapter.renumbered import Renumbered
from kvarena.conformance.vectors.replay import VECTOR_DIR
from kvarena.spec.models import ArenaConfig

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "conformance" / "CHANGELOG.md"
SECTION = re.compile(r"^## (\d+) \((\d{4}-\d\d-\d\d)\): (.+)$", re.M)
ONE = str(VECTOR_DIR / "errors-every-code.jsonl")
ME = __name__
# not imported by name: this module's own factories would then declare it (a module-level PROTOCOL_VERSION)
CURRENT = protocol.PROTOCOL_VERSION


def written_for_4(config: ArenaConfig) -> Any:
    return Renumbered(config)


written_for_4.PROTOCOL_VERSION = 4  # type: ignore[attr-defined]


def written_for_now(config: ArenaConfig) -> Any:
    return Renumbered(config)


written_for_now.PROTOCOL_VERSION = CURRENT  # type: ignore[attr-defined]


def undeclared(config: ArenaConfig) -> Any:
    return Renumbered(config)


def test_every_version_has_its_change_and_its_changelog_section() -> None:
    assert sorted(PROTOCOL_CHANGES) == list(range(1, CURRENT + 1))
    sections = {int(v): date for v, date, _ in SECTION.findall(CHANGELOG.read_text())}
    assert sections == {v: date for v, (date, _, _) in PROTOCOL_CHANGES.items()}, sections
    text = CHANGELOG.read_text()
    assert text.index("## Unreleased") < text.index(f"## {CURRENT} ("), "the next change's place comes first"
    assert f"PROTOCOL_VERSION = {CURRENT}" in text


def test_the_changelog_dates_are_the_commits() -> None:
    """Each section's date is the date of every commit it cites (git log), so the history is checkable."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    text = CHANGELOG.read_text()
    starts = [(m.start(), m.group(2)) for m in SECTION.finditer(text)] + [(len(text), "")]
    checked = 0
    for (start, date), (end, _) in zip(starts, starts[1:]):
        for sha in re.findall(r"\b([0-9a-f]{7})\b", text[start:end]):
            r = subprocess.run(["git", "show", "-s", "--format=%ad", "--date=short", sha], cwd=REPO,
                               capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"commit {sha} is not in this clone (a shallow one?)")
            assert r.stdout.strip() == date, (sha, r.stdout, date)
            checked += 1
    assert checked >= 8


def test_declared_version_is_the_factorys_or_its_modules() -> None:
    assert declared_version(written_for_4) == 4
    assert declared_version(undeclared) is None
    from kvarena.conformance.example import adapter

    assert declared_version(adapter.make) == CURRENT == adapter.PROTOCOL_VERSION  # module level


def test_an_older_adapter_is_told_every_change_since() -> None:
    notes = version_notes(written_for_4)
    assert notes[0].startswith("warning: the adapter was written for protocol version 4")
    for v in range(5, CURRENT + 1):
        date, what, change = PROTOCOL_CHANGES[v]
        assert any(f"version {v} ({date}): {what}. Change: {change}." in n for n in notes), v
    assert not any("version 4 (" in n for n in notes)  # it already follows its own version
    assert notes[-1].strip() == f"then set PROTOCOL_VERSION = {CURRENT}"


def test_the_current_version_kvarena_own_and_odd_declarations() -> None:
    assert version_notes(written_for_now) == []
    from kvarena.reference.arena import Arena

    assert version_notes(Arena) == []  # kvarena's own implementations move with the protocol
    (note,) = version_notes(undeclared)
    assert note.startswith("note: the adapter declares no PROTOCOL_VERSION") and f"= {CURRENT}" in note

    def newer(config: ArenaConfig) -> Any:
        return Renumbered(config)

    newer.PROTOCOL_VERSION = CURRENT + 1  # type: ignore[attr-defined]
    (note,) = version_notes(newer)
    assert "newer than this kvarena's" in note
    newer.PROTOCOL_VERSION = "7"  # type: ignore[attr-defined]
    (note,) = version_notes(newer)
    assert "PROTOCOL_VERSION is '7'" in note


def test_conform_warns_an_older_adapter_and_still_passes(capsys: pytest.CaptureFixture) -> None:
    code = main(["conform", "--impl", f"{ME}:written_for_4", "--level", "decisions", "--vectors", ONE,
                 "--examples", "0", "-q"])
    out = capsys.readouterr().out
    assert code == 0, out  # a warning, not a failure
    assert "warning: the adapter was written for protocol version 4" in out.splitlines()[1]
    assert f"version {CURRENT} (" in out
    code = main(["conform", "--impl", f"{ME}:written_for_4", "--level", "decisions", "--vectors", ONE,
                 "--examples", "0", "-q", "--json"])
    import json

    protocol = json.loads(capsys.readouterr().out)["protocol"]
    assert protocol["version"] == CURRENT and protocol["declared"] == 4 and len(protocol["notes"]) > 2
