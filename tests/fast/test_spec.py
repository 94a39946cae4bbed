"""spec/arena.md stays honest: its Python excerpts, tables and traceability links match the code.

Every checker is a function of the markdown text (and a repository root), returning a list of
problems, so the negative tests below can feed it a small drifted document and see it complain.

Refresh every excerpt from the reference after a deliberate code change with
``python tests/fast/test_spec.py --update`` and review the diff of spec/arena.md.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvarena.reference.invariants import INVARIANTS
from kvarena.spec import layout, models
from kvarena.spec.errors import ERROR_CODES
from kvarena.spec.layout import entry_layout, page_bytes

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "arena.md"

# Test files the traceability table may link before they exist (other work in flight). Used only
# while the file is absent: once it exists, every name linked in it must resolve.
PENDING_TEST_FILES = {
    "tests/fast/test_machine.py",
    "tests/quality/test_mutants.py",
    "tests/fast/test_invariants.py",
}
PROOFS_PENDING = "pending (issue: Proofs)"
TRACE_HEADER = "| ID | Predicate | Tests | Proofs |"
FIX = "update spec/arena.md from the reference or vice versa"

# Excerpts the spec must show: the ladder, its rung 1, the exact split sizing; every invariant predicate is required
# too (test_required_excerpts_present). The rest of the contract is guard / effect prose.
REQUIRED_EXCERPTS = {
    "reference/arena.py": ["Arena.ladder"],
    "reference/ladder.py": ["place"],
    "reference/sizing.py": ["split_bytes"],
}
REQUIRED_CONSTANTS = {"ROW_ALIGN", "ENTRY_ALIGN", "DTYPE_BYTES", "DEFAULT_SWA_FULL_TOKENS_RATIO",
                      "DEFAULT_MAMBA_FULL_MEMORY_RATIO"}

_EXCERPT = re.compile(r"^<!--\s*excerpt:\s*(\S+)\s+([\w.]+)\s*-->\s*$")
_ILLUSTRATIVE = re.compile(r"^<!--\s*illustrative\s*-->\s*$")


# ---------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True)
class Block:
    lang: str
    start: int  # 0-based index of the opening fence line
    end: int  # index of the closing fence line
    code: str
    marker: str  # the line just above the opening fence


def fenced_blocks(text: str) -> list[Block]:
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):  # indented fences count too, so none escapes the checks
            lang = lines[i].lstrip()[3:].strip()
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"line {i + 1}: unclosed code fence")
            blocks.append(Block(lang, i, j, "\n".join(lines[i + 1:j]), lines[i - 1] if i else ""))
            i = j + 1
        else:
            i += 1
    return blocks


def sections(text: str, level: int = 2) -> dict[str, str]:
    """Heading text -> body, for headings of exactly ``level`` (outside code fences)."""
    out: dict[str, str] = {}
    name, body, in_fence = None, [], False
    prefix = "#" * level + " "
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith(prefix):
            if name is not None:
                out[name] = "\n".join(body)
            name, body = line[len(prefix):].strip(), []
        elif not in_fence and level > 1 and re.match(rf"^#{{1,{level - 1}}} ", line):
            if name is not None:
                out[name] = "\n".join(body)
            name, body = None, []
        elif name is not None:
            body.append(line)
    if name is not None:
        out[name] = "\n".join(body)
    return out


def tables(body: str) -> list[list[list[str]]]:
    """Markdown tables in ``body``: rows of stripped cells, header first, separator dropped."""
    out, cur = [], []
    for line in [*body.split("\n"), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                cur.append(cells)
        elif cur:
            out.append(cur)
            cur = []
    return out


def plain(cell: str) -> str:
    return cell.replace("`", "").strip()


# ---------------------------------------------------------------------------------------------
# Excerpts


def find_definition(tree: ast.Module, qualname: str) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        scope = node.body if isinstance(node, ast.ClassDef) else []
    return node


def source_of(root: Path, path: str, qualname: str) -> str:
    """The definition's source as ast.get_source_segment gives it, dedented (decorators excluded)."""
    file = root / path
    if not file.is_file():
        raise LookupError(f"{path} does not exist")
    src = file.read_text()
    node = find_definition(ast.parse(src), qualname)
    if node is None:
        raise LookupError(f"{path} defines no {qualname}")
    return textwrap.dedent(ast.get_source_segment(src, node, padded=True))


def excerpts(text: str) -> list[tuple[str, str, Block]]:
    """(path, qualname, block) for every excerpt marker that is followed by a python block."""
    out = []
    for b in fenced_blocks(text):
        m = _EXCERPT.match(b.marker)
        if m:
            out.append((m.group(1), m.group(2), b))
    return out


def excerpt_problems(text: str, root: Path = ROOT) -> list[str]:
    problems = []
    lines = text.split("\n")
    fenced_at = {b.start - 1 for b in fenced_blocks(text)}
    for i, line in enumerate(lines):  # a marker must sit directly on a python fence
        if _EXCERPT.match(line) and i not in fenced_at:
            problems.append(f"line {i + 1}: excerpt marker not directly followed by a ```python block")
    for path, qual, b in excerpts(text):
        where = f"line {b.start + 1}: excerpt {path} {qual}"
        if b.lang != "python":
            problems.append(f"{where}: the block is ```{b.lang}, not ```python")
            continue
        try:
            want = source_of(root, path, qual)
        except (LookupError, SyntaxError) as e:
            problems.append(f"{where}: {e}")
            continue
        if b.code != want:
            diff = "\n".join(difflib.unified_diff(b.code.split("\n"), want.split("\n"), "spec/arena.md", path,
                                                  lineterm=""))
            problems.append(f"{where} drifted from the source ({FIX}; "
                            f"`python tests/fast/test_spec.py --update` refreshes every excerpt):\n{diff}")
    return problems


def unmarked_python_blocks(text: str) -> list[str]:
    return [f"line {b.start + 1}: ```python block is neither an excerpt (<!-- excerpt: PATH QUALNAME -->) "
            "nor marked <!-- illustrative -->"
            for b in fenced_blocks(text)
            if b.lang == "python" and not _EXCERPT.match(b.marker) and not _ILLUSTRATIVE.match(b.marker)]


def missing_required_excerpts(text: str, required: dict[str, list[str]] = REQUIRED_EXCERPTS) -> list[str]:
    have = {(p, q) for p, q, _ in excerpts(text)}
    return [f"spec/arena.md shows no excerpt of {p} {q}" for p, qs in required.items() for q in qs
            if (p, q) not in have]


def update_excerpts(text: str, root: Path = ROOT) -> str:
    """``text`` with every excerpt block replaced by the current source."""
    lines = text.split("\n")
    for path, qual, b in reversed(excerpts(text)):
        lines[b.start + 1:b.end] = source_of(root, path, qual).split("\n")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Traceability


def _names_defined(file: Path) -> set[str]:
    """Top-level functions, classes and assigned names, plus Class::method pairs."""
    names: set[str] = set()
    for n in ast.parse(file.read_text()).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
            if isinstance(n, ast.ClassDef):
                names.update(f"{n.name}::{m.name}" for m in n.body
                             if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
    return names


def link_problem(link: str, root: Path, pending: set[str]) -> str | None:
    path, sep, name = link.partition("::")
    if not sep or not name or not path.endswith(".py"):
        return f"{link!r} is not a path::name link"
    file = root / path
    if not file.is_file():
        return None if path in pending else f"{link}: {path} does not exist"
    if name not in _names_defined(file):
        return f"{link}: {path} defines no {name}"
    return None


def module_path(module: str) -> str:
    """``kvarena.reference.invariants`` -> ``reference/invariants.py`` (the package-dir mapping)."""
    return module.removeprefix("kvarena.").replace(".", "/") + ".py"


def trace_rows(text: str) -> list[list[str]]:
    body = sections(text).get("Traceability")
    if body is None:
        raise LookupError("spec/arena.md has no '## Traceability' section")
    for t in tables(body):
        if "| " + " | ".join(t[0]) + " |" == TRACE_HEADER:
            return t[1:]
    raise LookupError(f"the Traceability section has no table with header {TRACE_HEADER}")


def traceability_problems(text: str, root: Path = ROOT, invariants=INVARIANTS,
                          pending: set[str] = PENDING_TEST_FILES) -> list[str]:
    try:
        rows = trace_rows(text)
    except LookupError as e:
        return [str(e)]
    problems = []
    ids = [plain(r[0]) for r in rows]
    if sorted(set(ids)) != sorted(ids):
        problems.append(f"duplicate IDs in the traceability table: {sorted(ids)}")
    if set(ids) != set(invariants):
        missing, unknown = sorted(set(invariants) - set(ids)), sorted(set(ids) - set(invariants))
        problems.append(f"traceability IDs {sorted(set(ids))} != INVARIANTS {sorted(invariants)}: "
                        f"missing {missing}, unknown {unknown}")
    for row in rows:
        if len(row) != 4:
            problems.append(f"row {row}: expected 4 cells")
            continue
        inv, pred, tests, proofs = (plain(c) for c in row)
        fn = invariants.get(inv)
        path, _, name = pred.partition("::")
        if fn is not None:
            if module_path(fn.__module__) != path or name != fn.__name__:
                problems.append(f"{inv}: predicate {pred!r} is not the registered "
                                f"{module_path(fn.__module__)}::{fn.__name__}")
            else:
                problems += [f"{inv}: {p}" for p in [link_problem(pred, root, set())] if p]
        links = [t.strip() for t in tests.split(",") if t.strip()]
        if not links:
            problems.append(f"{inv}: no test links")
        problems += [f"{inv}: {p}" for p in (link_problem(t, root, pending) for t in links) if p]
        if proofs != PROOFS_PENDING:
            plinks = [t.strip() for t in proofs.split(",") if t.strip()]
            if not plinks:
                problems.append(f"{inv}: Proofs cell is empty; write {PROOFS_PENDING!r} or path::name links")
            problems += [f"{inv}: {p}" for p in (link_problem(t, root, set()) for t in plinks) if p]
    return problems


# ---------------------------------------------------------------------------------------------
# Headings and tables against the code


def invariant_heading_problems(text: str, ids=tuple(INVARIANTS)) -> list[str]:
    body = sections(text).get("Invariants")
    if body is None:
        return ["spec/arena.md has no '## Invariants' section"]
    heads = {m.group(1) for m in re.finditer(r"^### `?(INV-[A-Z0-9-]+)`?\s*$", body, re.M)}
    problems = [f"no '### {i}' heading in §Invariants" for i in ids if i not in heads]
    problems += [f"§Invariants has a heading {h} that INVARIANTS does not register"
                 for h in sorted(heads - set(ids))]
    return problems


def error_table_problems(text: str, codes=ERROR_CODES) -> list[str]:
    body = sections(text).get("Errors")
    if body is None:
        return ["spec/arena.md has no '## Errors' section"]
    rows = {plain(r[0]): plain(r[1]) for t in tables(body) if t[0][:2] == ["Class", "Code"] for r in t[1:]}
    by_name = {cls.__name__: cls for cls in codes.values()}
    problems = [f"§Errors table lacks {n}" for n in by_name if n not in rows]
    for n, code in rows.items():
        if n not in by_name:
            problems.append(f"§Errors table lists {n}, which is not in ERROR_CODES")
        elif by_name[n].code != code:
            problems.append(f"§Errors: {n} has code {by_name[n].code!r}, the table says {code!r}")
    return problems


def constants_problems(text: str) -> list[str]:
    body = sections(text).get("Constants")
    if body is None:
        return ["spec/arena.md has no '## Constants' section"]
    seen, problems = set(), []
    for t in tables(body):
        for r in t[1:]:
            name = plain(r[0])
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
                continue
            seen.add(name)
            actual = getattr(layout, name, getattr(models, name, None))
            try:
                value = ast.literal_eval(plain(r[1]))
            except (ValueError, SyntaxError):
                problems.append(f"§Constants: {name} value {r[1]!r} is not a Python literal")
                continue
            if value != actual:
                problems.append(f"§Constants: {name} = {value!r} in the spec, {actual!r} in the code")
    problems += [f"§Constants lacks {n}" for n in sorted(REQUIRED_CONSTANTS - seen)]
    return problems


def preset_table_problems(text: str) -> list[str]:
    """The presets table's entry and page bytes are what spec/layout.py computes."""
    body = sections(text).get("Layouts", "")
    table = next((t for t in tables(body) if t[0][:3] == ["Preset", "Class", "Kind"]), None)
    if table is None:
        return ["§Layouts has no presets table (header | Preset | Class | Kind | ...)"]
    head = table[0]
    col_e, col_p = head.index("Entry B"), head.index("Page B (64 tokens)")
    problems, seen = [], set()
    for r in table[1:]:
        name, cls = plain(r[0]), plain(r[1])
        seen.add((name, cls))
        try:
            c = models.preset(name).cls(cls)
        except Exception as e:  # an unknown preset or class is itself the finding
            problems.append(f"presets table: {name}/{cls}: {e}")
            continue
        if plain(r[2]) != c.kind.value:
            problems.append(f"presets table: {name}/{cls} kind {plain(r[2])!r} != {c.kind.value!r}")
        for col, want in ((col_e, entry_layout(c).entry_bytes), (col_p, page_bytes(c, 64))):
            got = plain(r[col]).replace(",", "")
            if got != str(want):
                problems.append(f"presets table: {name}/{cls} {head[col]} {r[col]} != {want:,}")
    for name in models.PRESETS:
        for c in models.preset(name).classes:
            if (name, c.name) not in seen:
                problems.append(f"presets table lacks {name}/{c.name}")
    return problems


# ---------------------------------------------------------------------------------------------
# The spec itself


@pytest.fixture(scope="module")
def spec_text() -> str:
    return SPEC.read_text()


def _report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s) in spec/arena.md:\n" + "\n\n".join(problems)


def test_excerpts_match_the_source(spec_text: str) -> None:
    assert excerpts(spec_text), "spec/arena.md has no excerpts"
    problems = excerpt_problems(spec_text)
    assert not problems, _report(problems)


def test_required_excerpts_present(spec_text: str) -> None:
    required = dict(REQUIRED_EXCERPTS)
    required["reference/invariants.py"] = [fn.__name__ for fn in INVARIANTS.values()]
    problems = missing_required_excerpts(spec_text, required)
    assert not problems, _report(problems)


def test_every_python_block_is_excerpt_or_illustrative(spec_text: str) -> None:
    problems = unmarked_python_blocks(spec_text)
    assert not problems, _report(problems)


def test_traceability(spec_text: str) -> None:
    problems = traceability_problems(spec_text)
    assert not problems, _report(problems)


def test_invariant_headings(spec_text: str) -> None:
    problems = invariant_heading_problems(spec_text)
    assert not problems, _report(problems)


def test_error_table(spec_text: str) -> None:
    problems = error_table_problems(spec_text)
    assert not problems, _report(problems)


def test_constants_table(spec_text: str) -> None:
    problems = constants_problems(spec_text)
    assert not problems, _report(problems)


def test_presets_table(spec_text: str) -> None:
    problems = preset_table_problems(spec_text)
    assert not problems, _report(problems)


def duplicate_excerpts(text: str) -> list[str]:
    seen: dict[tuple[str, str], int] = {}
    for path, qual, _b in excerpts(text):
        seen[(path, qual)] = seen.get((path, qual), 0) + 1
    return [f"excerpt {p} {q} appears {n} times; show each definition once" for (p, q), n in seen.items() if n > 1]


def conjunct_problems(text: str, conjuncts) -> list[str]:
    """Each invariant's subsection of §Invariants writes every conjunct proofs/model.py gives it, by name."""
    body = sections(text).get("Invariants", "")
    subs = {t.strip("` "): b for t, b in sections("## Invariants\n" + body, 3).items()}
    return [f"§Invariants: {c.inv} does not write the conjunct {c.name!r} of proofs/model.py"
            for c in conjuncts if not re.search(rf"^{re.escape(c.name)}\b", subs.get(c.inv, ""), re.M)]


def test_no_excerpt_twice(spec_text: str) -> None:
    problems = duplicate_excerpts(spec_text)
    assert not problems, _report(problems)
    doc = _fence("pass", "<!-- excerpt: reference/bands.py Band -->")
    assert duplicate_excerpts(doc + "\n" + doc)


def test_invariants_written_as_the_model_conjuncts(spec_text: str) -> None:
    model = pytest.importorskip("kvarena.proofs.model")
    problems = conjunct_problems(spec_text, model.CONJUNCTS)
    assert not problems, _report(problems)
    planted = spec_text.replace("\npartition ", "\nseparation ", 1)
    assert conjunct_problems(planted, model.CONJUNCTS) == [
        "§Invariants: INV-NO-OVERLAP does not write the conjunct 'partition' of proofs/model.py"]


def test_required_sections_in_order(spec_text: str) -> None:
    want = ["Diff against SGLang 0.5.23", "Notation", "Constants", "Layouts", "Configuration and refusals", "State",
            "Operations", "Admission ladder", "Policies", "Ledger", "Split-pool baseline", "Errors", "Invariants",
            "Traceability", "Refinements", "Appendix: invariant predicates"]
    have = [s for s in sections(spec_text) if s in want]
    assert have == want, f"spec/arena.md sections {have}, want {want} in this order"


def test_one_heading_per_operation(spec_text: str) -> None:
    body = sections(spec_text)["Operations"]
    heads = set(re.findall(r"^### `(\w+)`", body, re.M))
    ops = {"admit", "extend", "share", "drop", "slide", "free", "acquire", "release", "write", "read",
           "compact", "relayout", "translate", "translate_token"}
    assert ops <= heads, f"§Operations lacks headings for {sorted(ops - heads)}"


# ---------------------------------------------------------------------------------------------
# The checkers can fail: small documents with planted drift


def _fence(code: str, marker: str) -> str:
    return f"{marker}\n```python\n{code}\n```\n"


def test_drifted_excerpt_is_reported() -> None:
    good = source_of(ROOT, "reference/bands.py", "Band.absorb_boundary_holes")
    marker = "<!-- excerpt: reference/bands.py Band.absorb_boundary_holes -->"
    assert excerpt_problems("# T\n\n" + _fence(good, marker)) == []
    drifted = good.replace("self.hi -= k", "self.hi -= k + 1")
    assert drifted != good
    problems = excerpt_problems("# T\n\n" + _fence(drifted, marker))
    assert len(problems) == 1 and "drifted" in problems[0]
    assert re.search(r"^-\s+self\.hi -= k \+ 1$", problems[0], re.M)
    assert re.search(r"^\+\s+self\.hi -= k$", problems[0], re.M)
    assert FIX in problems[0]
    fixed = update_excerpts("# T\n\n" + _fence(drifted, marker))
    assert excerpt_problems(fixed) == []


def test_bad_excerpt_targets_are_reported() -> None:
    doc = (_fence("pass", "<!-- excerpt: reference/bands.py Band.no_such_method -->")
           + _fence("pass", "<!-- excerpt: reference/nowhere.py f -->")
           + "<!-- excerpt: reference/bands.py Band -->\n\ntext\n")
    problems = excerpt_problems(doc)
    assert len(problems) == 3
    assert any("defines no Band.no_such_method" in p for p in problems)
    assert any("does not exist" in p for p in problems)
    assert any("not directly followed" in p for p in problems)


def test_unmarked_python_block_is_reported() -> None:
    doc = ("```python\nx = 1\n```\n\n<!-- illustrative -->\n```python\ny = 2\n```\n\n```text\nz\n```\n"
           "\n- a list item:\n\n  ```python\n  w = 3\n  ```\n")
    problems = unmarked_python_blocks(doc)
    assert [p.split(":")[0] for p in problems] == ["line 1", "line 16"]


def _trace_doc(rows: list[str]) -> str:
    return "## Traceability\n\n" + TRACE_HEADER + "\n|---|---|---|---|\n" + "\n".join(rows) + "\n\n## Next\n"


def test_traceability_checker_fails(tmp_path: Path) -> None:
    (tmp_path / "reference").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "reference" / "invariants.py").write_text("def check_no_overlap(a):\n    pass\n\n\n"
                                                          "def check_band_order(a):\n    pass\n")
    one = {"INV-NO-OVERLAP": INVARIANTS["INV-NO-OVERLAP"], "INV-BAND-ORDER": INVARIANTS["INV-BAND-ORDER"]}
    pred = "reference/invariants.py::check_no_overlap"

    def problems(rows: list[str], pending: frozenset[str] = frozenset()) -> list[str]:
        return traceability_problems(_trace_doc(rows), tmp_path, one, set(pending))

    ok = [f"| INV-NO-OVERLAP | `{pred}` | tests/test_here.py::test_a | {PROOFS_PENDING} |",
          "| INV-BAND-ORDER | reference/invariants.py::check_band_order | tests/test_here.py::test_a | "
          "tests/test_here.py::test_a |"]
    assert problems(ok) == []
    # an ID missing from the table
    assert any("missing ['INV-BAND-ORDER']" in p for p in problems(ok[:1]))
    # a predicate that is not the registered one
    wrong = ok[1].replace("check_band_order", "check_no_overlap")
    assert any("not the registered" in p for p in problems([ok[0], wrong]))
    # a test name the file does not define
    assert any("defines no test_b" in p for p in problems([ok[0].replace("test_a", "test_b"), ok[1]]))
    # no test link at all
    assert any("no test links" in p for p in problems([f"| INV-NO-OVERLAP | {pred} |  | {PROOFS_PENDING} |",
                                                         ok[1]]))
    # a missing file: allowed only while pending and absent
    later = ok[0].replace("tests/test_here.py::test_a", "tests/later.py::test_x")
    assert any("does not exist" in p for p in problems([later, ok[1]]))
    assert problems([later, ok[1]], {"tests/later.py"}) == []
    (tmp_path / "tests" / "later.py").write_text("def test_y():\n    pass\n")
    assert any("defines no test_x" in p for p in problems([later, ok[1]], {"tests/later.py"}))
    # a proofs cell that is neither pending nor resolvable
    unproven = ok[0].replace(PROOFS_PENDING, "proofs/x.py::p")
    assert any("does not exist" in p for p in problems([unproven, ok[1]]))
    assert any("Proofs cell is empty" in p for p in problems([ok[0].replace(PROOFS_PENDING, " "), ok[1]]))
    # a registered predicate whose file no longer defines it
    (tmp_path / "reference" / "invariants.py").write_text("def check_no_overlap(a):\n    pass\n")
    assert any("defines no check_band_order" in p for p in problems(ok))


def test_heading_and_table_checkers_fail() -> None:
    doc = ("## Invariants\n\n### INV-NO-OVERLAP\n\n### INV-GHOST\n\n"
           "## Errors\n\n| Class | Code |\n|---|---|\n"
           "| `ArenaError` | `ArenaError` |\n| `DoubleFreeError` | `Oops` |\n")
    heads = invariant_heading_problems(doc, ("INV-NO-OVERLAP", "INV-BAND-ORDER"))
    assert heads == ["no '### INV-BAND-ORDER' heading in §Invariants",
                     "§Invariants has a heading INV-GHOST that INVARIANTS does not register"]
    errs = error_table_problems(doc)
    assert any("lacks AdmissionRejectedError" in p for p in errs)
    assert any("DoubleFreeError has code 'DoubleFree'" in p for p in errs)
    consts = constants_problems("## Constants\n\n| Name | Value |\n|---|---|\n| ROW_ALIGN | 8 |\n")
    assert "§Constants: ROW_ALIGN = 8 in the spec, 16 in the code" in consts
    assert "§Constants lacks ENTRY_ALIGN" in consts


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        SPEC.write_text(update_excerpts(SPEC.read_text()))
        n = len(excerpts(SPEC.read_text()))
        print(f"refreshed {n} excerpts in {SPEC.relative_to(ROOT)}; review the diff")
    else:
        sys.exit("usage: python tests/fast/test_spec.py --update")
