"""No dangling reference in the documents a reviewer reads: spec/arena.md, README.md, docs/*.md, proofs/README.md.

- a ``§Title`` names a heading of the document it points at: the ``.md`` file written just before it (a path or a
  link), else the document itself, else spec/arena.md; a numbered ``§6`` / ``§8.2`` resolves only in a document
  whose headings are numbered that way (the spec's are not);
- no ``issue N``: the issue tracker is not part of the repository;
- every repository path (``spec/...``, ``reference/...``, ``README.md``, ``path::name``, globs) exists, and a
  ``path::name`` link names something the file defines; every relative markdown link (and its ``#anchor``) resolves;
- every vector named exists, with the steps cited;
- spec/arena.md: every ``sglang/...py:N[-M]`` citation exists in the installed wheel and holds the name quoted
  after it; the table of contents lists every ``##`` heading; the diff against SGLang has its required rows and
  names every SGLang unit test docs/sglang-unit-ports.md says the contract does not follow;
- every ``spec/arena.md §Title`` in the repository's Python files names a heading of the spec.

Every checker is a function of a document's text, so the negative tests feed it planted dangling references.
"""

from __future__ import annotations

import importlib.machinery
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = "spec/arena.md"
VECTORS = ROOT / "conformance" / "vectors"
# Top-level folders and files a path may start with; ``kvarena/X/...`` is the installed name of ``X/...``.
TOP = ("spec", "reference", "gpu", "conformance", "proofs", "kvarena", "tests", "bench", "docs", "simulator", ".ci")
ROOT_FILES = ("README.md", "Makefile", "pyproject.toml", "requirements-ci.txt", "tox.ini")
DIFF_ROWS = ("Zeroing", "Sink and padding", "Virtual ids", "Tombstones", "Move gates", "Fused draft KV", "Refusals")


def checked_docs(root: Path = ROOT) -> list[str]:
    return [SPEC, "README.md", "proofs/README.md", *sorted(p.relative_to(root).as_posix()
                                                          for p in (root / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------------------------
# Parsing


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, paragraph) for the text outside code fences; a paragraph's lines joined by spaces, so a
    reference wrapped over two lines is seen whole. Table rows are paragraphs of their own."""
    out: list[tuple[int, str]] = []
    cur: list[str] = []
    start, fence = 0, False

    def flush() -> None:
        if cur:
            out.append((start, " ".join(s.strip() for s in cur)))
            cur.clear()

    for i, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            flush()
            fence = not fence
            continue
        if fence:
            continue
        if not line.strip() or line.startswith(("#", "|", "- ", "* ")) or re.match(r"^\d+\. ", line):
            flush()
        if line.strip():
            if not cur:
                start = i
            cur.append(line)
            if line.startswith(("#", "|")):
                flush()
    flush()
    return out


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.replace("`", "").replace("*", "")).strip().lower()


def headings(text: str) -> list[str]:
    out, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def anchor(title: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


# ---------------------------------------------------------------------------------------------
# Checkers


_SECTION = re.compile(r"§\s*")
_MD_BEFORE = re.compile(r"(?:\[[^\]]*\]\(([^)\s#]+\.md)(?:#[^)]*)?\)|`?((?:\.\./)*[\w./-]+\.md)`?)[\s,]*$")
_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.I)


def section_ref_problems(rel: str, text: str, read: Callable[[str], str | None]) -> list[str]:
    """Dangling ``§`` references and ``issue N`` mentions in document ``rel``; ``read(path)`` gives another
    document's text (None if it does not exist)."""
    problems = []
    own = [norm(h) for h in headings(text)]
    spec = read(SPEC)
    spec_heads = [norm(h) for h in headings(spec)] if spec is not None else []
    for line, para in prose(text):
        for m in _ISSUE.finditer(para):
            problems.append(f"{rel}:{line}: {m.group(0)!r}: the issue tracker is not in the repository; cite the "
                            "section, file or test that holds the point")
        for m in _SECTION.finditer(para):
            rest = norm(para[m.end():])
            before = _MD_BEFORE.search(para[:m.start()])
            if before:
                target = before.group(1) or before.group(2)
                path = (Path(rel).parent / target).as_posix() if before.group(1) else target
                path = _resolve(rel, path)
                other = read(path) if path else None
                if other is None:
                    problems.append(f"{rel}:{line}: §{rest[:30]!r} points into {target}, which is not in the "
                                    "repository")
                    continue
                pools = [[norm(h) for h in headings(other)]]
            else:
                target = f"{rel} or {SPEC}"
                pools = [own, spec_heads]
            if not any(_matches(rest, heads) for heads in pools):
                problems.append(f"{rel}:{line}: dangling reference §{para[m.end():m.end() + 40]!r}: no heading of "
                                f"{target} starts it" + (" (numbered sections are not stable: name the heading)"
                                                         if rest[:1].isdigit() else ""))
    return problems


def _matches(rest: str, heads: list[str]) -> bool:
    """The words after ``§`` begin with a heading's words: all of them, or at least its first two."""
    words = _WORDS.findall(rest)
    for h in heads:
        hw = _WORDS.findall(h)
        k = next((i for i, (a, b) in enumerate(zip(words, hw)) if a != b), min(len(words), len(hw)))
        if hw and not hw[0][:1].isdigit() and (k == len(hw) or k >= 2):
            return True
        if rest[:1].isdigit() and h.startswith(rest.split(" ")[0].rstrip(".,;:)") + "."):
            return True  # "§5" in a document whose heading reads "5. ..."
    return False


_WORDS = re.compile(r"[\w-]+(?:\.\d+)*")


def _resolve(rel: str, path: str) -> str | None:
    """A path written in ``rel`` -> a repository path, or None if it leaves the repository."""
    base = Path(rel).parent if path.startswith("../") else Path()
    parts: list[str] = []
    for p in (base / path).as_posix().split("/"):
        if p == "..":
            if not parts:
                return None
            parts.pop()
        elif p not in ("", "."):
            parts.append(p)
    return "/".join(parts)


_TOPS = "|".join(re.escape(t) for t in TOP)
_FILES = "|".join(re.escape(f) for f in ROOT_FILES)
_PATH = re.compile(rf"(?<![\w/.$-])((?:\.\./)+[\w./*-]*[\w*]|(?:(?:{_TOPS})/[\w./*-]*[\w*/]|(?:{_FILES})\b)(?:::\w+)?)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def path_problems(rel: str, text: str, root: Path) -> list[str]:
    """Repository paths and relative links in ``rel`` that do not resolve."""
    problems = []
    for line, para in prose(text):
        for m in _LINK.finditer(para):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, frag = target.partition("#")
            path = _resolve(rel, (Path(rel).parent / file).as_posix()) if file else rel
            if path is None or not (root / path).exists():
                problems.append(f"{rel}:{line}: link ({target}) does not resolve")
            elif frag and path.endswith(".md") and frag not in {anchor(h) for h in headings((root / path).read_text())}:
                problems.append(f"{rel}:{line}: link ({target}): {path} has no heading #{frag}")
        for m in _PATH.finditer(_LINK.sub(" ", para)):
            token = m.group(1).rstrip(".")
            file, sep, name = token.partition("::")
            path = _resolve(rel, file) if file.startswith("../") else file
            if path and path.startswith("kvarena/") and path.split("/")[1] in TOP:
                path = path.removeprefix("kvarena/")  # the installed package name of a top-level folder
            if path is None:
                problems.append(f"{rel}:{line}: {token} leaves the repository")
            elif "*" in path:
                if not list(root.glob(path)):
                    problems.append(f"{rel}:{line}: {token} matches no file")
            elif not (root / path).exists():
                problems.append(f"{rel}:{line}: {token} does not exist")
            elif sep and path.endswith(".py") and not _defines((root / path).read_text(), name):
                problems.append(f"{rel}:{line}: {token}: {path} defines no {name}")
    return problems


def _defines(src: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async def|def|class)\s+{name}\b|^{name}\s*[:=]", src, re.M) is not None


_CITE = re.compile(r"`(sglang/[\w/.]+\.py)?:(\d+)(?:-(\d+))?`(?:\s*`([^`]+)`)?")


def sglang_cite_problems(text: str, wheel: Path) -> list[str]:
    """Each ``sglang/path.py:N[-M]`` (or ``:N`` after one, in the same paragraph) exists in the wheel and the
    name quoted right after it occurs in lines N..M."""
    problems = []
    for line, para in prose(text):
        last = None
        for m in _CITE.finditer(para):
            file, a, b, name = m.group(1), int(m.group(2)), m.group(3), m.group(4)
            if file is None and last is None:
                continue  # a bare ":N" with no file before it is not a citation
            file = file or last
            last = file
            src = wheel.parent / file
            if not src.is_file():
                problems.append(f"{SPEC}:{line}: {file} is not in the installed sglang wheel")
                continue
            lines = src.read_text().split("\n")
            hi = int(b) if b else a
            if not 1 <= a <= hi <= len(lines):
                problems.append(f"{SPEC}:{line}: {file}:{a}-{hi} is outside the file ({len(lines)} lines)")
            elif name and name not in "\n".join(lines[a - 1:hi]):
                problems.append(f"{SPEC}:{line}: {file}:{a}{'-' + b if b else ''} does not hold {name!r}")
    return problems


_VECTOR = re.compile(r"([\w*-]+\.jsonl)`?((?:\s+steps?\s+[\d\-–, ]+(?:and\s+\d+)?)?)")


def vector_problems(text: str, vectors: Path) -> list[str]:
    """Every vector named exists (a glob matches one); every step cited is inside it."""
    problems = []
    for line, para in prose(text):
        for m in _VECTOR.finditer(para):
            name, steps = m.group(1), m.group(2)
            files = sorted(vectors.glob(name))
            if not files:
                problems.append(f"{SPEC}:{line}: vector {name} is not in {vectors.relative_to(ROOT)}")
                continue
            if steps and "*" not in name:
                n = json.loads(files[0].read_text().split("\n", 1)[0])["steps"]
                cited = [int(x) for x in re.findall(r"\d+", steps)]
                if any(not 1 <= s <= n for s in cited):
                    problems.append(f"{SPEC}:{line}: {name} has {n} steps; the spec cites steps {cited}")
    return problems


def toc_problems(text: str) -> list[str]:
    """The contents list before the first ``##`` links every ``##`` heading, in order."""
    first = text.find("\n## ")
    toc = re.findall(r"^- \[([^\]]+)\]\(#([^)]+)\)$", text[:first], re.M)
    want = [h[3:].strip() for h in text.split("\n") if h.startswith("## ")]
    problems = []
    if [t for t, _ in toc] != want:
        problems.append(f"{SPEC}: the contents list {[t for t, _ in toc]} is not the ## headings {want}")
    problems += [f"{SPEC}: contents entry {t!r} links #{a}, not #{anchor(t)}" for t, a in toc if a != anchor(t)]
    return problems


def diff_problems(text: str, ports: str) -> list[str]:
    """The diff against SGLang has its required rows and names every unit test the ports doc says it departs from."""
    start = text.find("\n## Diff against SGLang 0.5.23")
    if start < 0:
        return [f"{SPEC} has no '## Diff against SGLang 0.5.23'"]
    body = text[start:text.find("\n## ", start + 1)]
    problems = [f"{SPEC}: the diff against SGLang has no **{r}** row" for r in DIFF_ROWS if f"| **{r}**" not in body]
    differs = ports[ports.find("## Where kvarena deliberately differs"):]
    differs = differs[:differs.find("\n## ", 1)]
    named = set(re.findall(r"\b(test_\w+)\b(?!\.py)", differs))
    problems += [f"{SPEC}: the diff against SGLang does not name {t}, which docs/sglang-unit-ports.md lists as not "
                 "followed" for t in sorted(named) if t not in body]
    return problems


_CODE_REF = re.compile(r"\bspec(?:/arena\.md)?,?\s+§\s*")


def code_ref_problems(root: Path = ROOT) -> list[str]:
    """``spec/arena.md §Title`` (or ``spec §Title``) in the repository's Python files names a heading of the spec."""
    heads = [norm(h) for h in headings((root / SPEC).read_text())]
    problems = []
    for top in TOP:
        for f in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else []:
            if f.name in ("test_spec_refs.py", "test_spec.py"):
                continue  # they quote references to test the checkers
            src = f.read_text()
            flat = re.sub(r"\n\s*(?:#\s*)?", " ", src)  # a reference wrapped over lines or comment lines
            for m in _CODE_REF.finditer(flat):
                rest = norm(flat[m.end():m.end() + 80])
                if not _matches(rest, heads):
                    problems.append(f"{f.relative_to(root)}: dangling spec/arena.md §{flat[m.end():m.end() + 40]!r}")
    return problems


def sglang_wheel() -> Path | None:
    # PathFinder searches sys.path only: find_spec would consult sys.modules, where another test in this worker
    # may have left a stand-in sglang without a __spec__
    spec = importlib.machinery.PathFinder.find_spec("sglang")
    return Path(spec.origin).parent if spec and spec.origin else None


def all_problems(docs_root: Path = ROOT, repo_root: Path = ROOT) -> list[str]:
    """Every problem in the checked documents under ``docs_root``; paths resolve against ``repo_root``."""
    def read(path: str) -> str | None:
        for base in (docs_root, repo_root):
            if (base / path).is_file():
                return (base / path).read_text()
        return None

    problems = []
    for rel in checked_docs(docs_root):
        text = (docs_root / rel).read_text()
        problems += section_ref_problems(rel, text, read)
        problems += path_problems(rel, text, repo_root)
    return problems


# ---------------------------------------------------------------------------------------------
# The documents


def test_no_dangling_reference_or_path() -> None:
    problems = all_problems()
    assert not problems, f"{len(problems)} dangling reference(s):\n" + "\n".join(problems)


def test_no_dangling_spec_reference_in_code() -> None:
    problems = code_ref_problems()
    assert not problems, f"{len(problems)} dangling reference(s) to spec/arena.md:\n" + "\n".join(problems)


def test_a_planted_spec_reference_in_code_fails(tmp_path: Path) -> None:
    (tmp_path / "spec").mkdir()
    (tmp_path / "reference").mkdir()
    (tmp_path / SPEC).write_text("# T\n\n## State\n\n### Float hints\n")
    (tmp_path / "reference" / "x.py").write_text('"""See spec/arena.md §State and spec/arena.md\n§Float hints."""\n')
    assert code_ref_problems(tmp_path) == []
    (tmp_path / "reference" / "y.py").write_text("# the rule of spec §Proofs\n")
    assert code_ref_problems(tmp_path) == ["reference/y.py: dangling spec/arena.md §'Proofs '"]


def test_sglang_citations_exist_in_the_wheel() -> None:
    wheel = sglang_wheel()
    if wheel is None:
        pytest.skip("sglang is not installed (make test installs it: Makefile SGLANG_PINS)")
    text = (ROOT / SPEC).read_text()
    assert len(_CITE.findall(text)) >= 20, "the spec cites fewer SGLang lines than its diff table has rows"
    problems = sglang_cite_problems(text, wheel)
    assert not problems, "\n".join(problems)


def test_vectors_named_exist() -> None:
    problems = [f"{rel}: {p}" for rel in checked_docs() for p in vector_problems((ROOT / rel).read_text(), VECTORS)]
    assert not problems, "\n".join(problems)


def test_contents_and_diff_table() -> None:
    text = (ROOT / SPEC).read_text()
    problems = toc_problems(text) + diff_problems(text, (ROOT / "docs" / "sglang-unit-ports.md").read_text())
    assert not problems, "\n".join(problems)


def test_spec_line_budget() -> None:
    n = len((ROOT / SPEC).read_text().rstrip("\n").split("\n"))
    assert n <= 1400, f"spec/arena.md has {n} lines; the reviewer's document stays within 1,400"


# ---------------------------------------------------------------------------------------------
# The checkers can fail


def _copy(tmp_path: Path) -> Path:
    for rel in checked_docs():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


@pytest.mark.parametrize(("planted", "words"), [
    ("See §No such heading.", "dangling reference"),
    ("As anchors §8.2 says.", "numbered sections are not stable"),
    ("The bare §6 of old.", "numbered sections are not stable"),
    ("Filed as issue 2.", "issue tracker"),
    ("In `peers-and-models.md` §5.", "not in the repository"),
    ("See `proofs/README.md` §No such part.", "no heading of proofs/README.md"),
    ("See reference/nowhere.py for it.", "does not exist"),
    ("See `reference/arena.py::no_such_function`.", "defines no no_such_function"),
    ("See [the doc](docs/nowhere.md).", "does not resolve"),
    ("See [the state](#no-such-anchor).", "has no heading #no-such-anchor"),
    ("See ../../outside.md.", "leaves the repository"),
])
def test_a_planted_dangling_reference_fails(tmp_path: Path, planted: str, words: str) -> None:
    docs = _copy(tmp_path)
    spec = docs / SPEC
    spec.write_text(spec.read_text() + f"\n{planted}\n")
    problems = all_problems(docs, ROOT)
    assert any(p.startswith(SPEC) and words in p for p in problems), problems


def test_a_planted_reference_in_another_document_fails(tmp_path: Path) -> None:
    docs = _copy(tmp_path)
    assert all_problems(docs, ROOT) == all_problems()
    readme = docs / "proofs" / "README.md"
    readme.write_text(readme.read_text() + "\nThe rules of §Nowhere apply.\n")
    assert any(p.startswith("proofs/README.md:") and "§'Nowhere" in p for p in all_problems(docs, ROOT))


def test_resolving_references() -> None:
    def read(path: str) -> str | None:
        return {SPEC: "## State\n### `read`\n## Diff against SGLang 0.5.23\n"}.get(path)

    own = "### 5. Five\n## Local part\n\n"
    assert section_ref_problems("docs/x.md", own + "See §Local part, §State, §`read`, §Diff against SGLang and\n"
                                "§5, and [spec](../spec/arena.md) §State.", read) == []
    assert len(section_ref_problems("docs/x.md", own + "§Stat and §6 and [spec](../spec/arena.md) §Local part",
                                    read)) == 3


def test_citation_vector_toc_and_diff_checkers_fail(tmp_path: Path) -> None:
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "sglang" / "srt" / "a.py").write_text("def alloc():\n    return 0\n")
    wheel = tmp_path / "sglang"
    ok = "| `sglang/srt/a.py:1-2` `alloc`; `:2` `return 0` |"
    assert sglang_cite_problems(ok, wheel) == []
    assert "does not hold 'free'" in sglang_cite_problems("`sglang/srt/a.py:1` `free`", wheel)[0]
    assert "outside the file" in sglang_cite_problems("`sglang/srt/a.py:9`", wheel)[0]
    assert "not in the installed" in sglang_cite_problems("`sglang/srt/b.py:1`", wheel)[0]
    assert "does not hold 'alloc'" in sglang_cite_problems("`sglang/srt/a.py:1` x `:2` `alloc`", wheel)[0]

    assert vector_problems("`sglang-sink-page.jsonl` step 3", VECTORS) == []
    assert "not in" in vector_problems("`no-such-vector.jsonl`", VECTORS)[0]
    assert "cites steps [99999]" in vector_problems("`sglang-sink-page.jsonl` step 99999", VECTORS)[0]

    good = "# T\n\n- [A b](#a-b)\n- [C](#c)\n\n## A b\n\n## C\n"
    assert toc_problems(good) == []
    assert toc_problems(good.replace("- [C](#c)\n", ""))
    assert toc_problems(good.replace("(#c)", "(#d)"))

    ports = "## Where kvarena deliberately differs\n\n| `t.py::test_one` | x |\n\n## Next\n\n`test_two`\n"
    rows = "".join(f"| **{r}** | x |\n" for r in DIFF_ROWS)
    assert diff_problems(f"x\n## Diff against SGLang 0.5.23\n\n{rows}| `test_one` |\n\n## N\n", ports) == []
    assert any("test_one" in p for p in diff_problems(f"x\n## Diff against SGLang 0.5.23\n\n{rows}\n## N\n", ports))
    assert any("**Tombstones**" in p for p in diff_problems(
        f"x\n## Diff against SGLang 0.5.23\n\n{rows.replace('Tombstones', 'X')}| `test_one` |\n## N\n", ports))
