"""spec/arena.md stays honest: its Python excerpts, tables and traceability links match the code, every name an
excerpt calls is defined in the document, and every operation states its guard as an ordered list of assertions.

The spec's appendix of invariant predicates is the companion page docs/spec-invariant-predicates.md, held to the
same checks; the presets table lives in docs/spec-rationale.md. Every checker is a function of the markdown text (and
a repository root), returning a list of problems, so the negative tests below can feed it a small drifted document
and see it complain.

Refresh every excerpt from the reference after a deliberate code change with
``python tests/fast/test_spec.py --update`` and review the diff of spec/arena.md and its companion.
"""

from __future__ import annotations

import ast
import builtins
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
PREDICATES = ROOT / "docs" / "spec-invariant-predicates.md"  # the spec's appendix: the invariant predicates' code
RATIONALE = ROOT / "docs" / "spec-rationale.md"  # what the spec moved out; its presets table is checked here

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
    "spec/pools.py": ["split_bytes"],
}
REQUIRED_CONSTANTS = {"ROW_ALIGN", "ENTRY_ALIGN", "DTYPE_BYTES", "DEFAULT_SWA_FULL_TOKENS_RATIO",
                      "DEFAULT_MAMBA_FULL_MEMORY_RATIO"}

# one file, one or more definitions of it: <!-- excerpt: reference/arena.py Arena._plan Arena._rejection -->
_EXCERPT = re.compile(r"^<!--\s*excerpt:\s*(\S+)\s+([\w.]+(?:\s+[\w.]+)*)\s*-->\s*$")
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


def excerpt_blocks(text: str) -> list[tuple[str, list[str], Block]]:
    """(path, qualnames, block) for every excerpt marker that is followed by a fenced block."""
    out = []
    for b in fenced_blocks(text):
        m = _EXCERPT.match(b.marker)
        if m:
            out.append((m.group(1), m.group(2).split(), b))
    return out


def excerpts(text: str) -> list[tuple[str, str, Block]]:
    """(path, qualname, block) for every definition an excerpt marker names (a block showing several definitions
    appears once per name)."""
    return [(path, q, b) for path, quals, b in excerpt_blocks(text) for q in quals]


def block_source(root: Path, path: str, quals: list[str]) -> str:
    """What an excerpt block must hold: each definition's source, in the marker's order, a blank line apart."""
    return "\n\n".join(source_of(root, path, q) for q in quals)


def excerpt_problems(text: str, root: Path = ROOT) -> list[str]:
    problems = []
    lines = text.split("\n")
    fenced_at = {b.start - 1 for b in fenced_blocks(text)}
    for i, line in enumerate(lines):  # a marker must sit directly on a python fence
        if _EXCERPT.match(line) and i not in fenced_at:
            problems.append(f"line {i + 1}: excerpt marker not directly followed by a ```python block")
    for path, quals, b in excerpt_blocks(text):
        where = f"line {b.start + 1}: excerpt {path} {' '.join(quals)}"
        if b.lang != "python":
            problems.append(f"{where}: the block is ```{b.lang}, not ```python")
            continue
        try:
            want = block_source(root, path, quals)
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
    for path, quals, b in reversed(excerpt_blocks(text)):
        lines[b.start + 1:b.end] = block_source(root, path, quals).split("\n")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Self-containment: what the excerpts call is in the document
#
# A reviewer must be able to read every excerpt to the bottom. For each excerpt, the checker resolves (through
# the imports of the file the excerpt comes from) every name it calls: a bare name ``f(...)``, the root of
# ``C.f(...)``, each name in a computed callee ``(f if x else g)(...)``, and each ``self.m(...)`` of the
# excerpt's class. Each must be
#   - local to the excerpt (a parameter, an assignment, a nested def), a builtin, or a name the file imports from
#     the standard library;
#   - defined in the document: an excerpt of that definition (a class excerpt defines its methods), a
#     ``### `name` `` operation heading (for ``self.name(...)``), a one-line definition in §Notation
#     (``name(params) = expression``, which must be the function's whole body, up to renaming its parameters), or
#   - an entry of PROSE_DEFINED, whose section must name it (and an entry no excerpt needs is reported).
# And no hidden state: every private attribute an excerpt reads (``x._y``) is a field §State lists, a
# definition the document shows, or a field of a class it shows. What a call on another object resolves to
# (``band.hole_run(...)``) is not checked: the checker does not infer types.

# What the document defines in prose instead of code: (file, name) -> the heading (or its start) of the section
# whose prose defines it (checked: the section names it in backticks outside its code blocks). Kept short on
# purpose; anything else an excerpt calls is an excerpt. Why prose suffices for each:
PROSE_DEFINED = {
    # spec/ data and rules the §Layouts / §Configuration text states exactly
    ("spec/models.py", "chain"): "The chain",  # a stable sort: recurrent, windows (longest first), full
    ("spec/layout.py", "entry_layout"): "Rows, state classes and entries",  # rows packed, aligned 16 / 32 B
    ("spec/layout.py", "entries_per_page"): "Rows, state classes and entries",  # page_size, or 1 (recurrent)
    ("spec/models.py", "worst_case_demand"): "The feasibility floor",  # the per-class formula
    ("spec/pools.py", "exact_ratio"): "Split-pool baseline",  # the decimal a ratio is written as
    # the shared vocabulary: fields given by the PLAN-SHAPE rule, classes by the §Errors table
    ("spec/types.py", "Plan"): "The validator's rules",
    ("spec/types.py", "Move"): "The validator's rules",
    ("spec/errors.py", "AdmissionRejectedError"): "Errors",
    ("spec/errors.py", "InvariantViolation"): "Errors",
    # rung 2's move sequence and rung 3's span choice, stated as rules: their code (reference/ladder.py, some 300
    # lines with compaction_view, float_target, float_span, span_free_slots) would not fit the spec's line budget;
    # rung 3's span arithmetic carries PEP 316 contracts that proofs/ proves
    ("reference/ladder.py", "EndPack"): "Rung 2",
    ("reference/ladder.py", "plan_compaction"): "Rung 2",
    ("reference/ladder.py", "plan_float_fewest"): "Rung 3",
    ("reference/ladder.py", "plan_float_relayout"): "Rung 3",
}


@dataclass(frozen=True)
class _Module:
    defs: frozenset[str]  # top-level functions, classes and assigned names
    imports: dict[str, tuple[str, str]]  # name -> (file, name) for kvarena imports, ("", module) for libraries


_MODULES: dict[tuple[Path, str], _Module] = {}


def _module(root: Path, path: str) -> _Module:
    key = (root, path)
    if key not in _MODULES:
        defs: set[str] = set()
        imports: dict[str, tuple[str, str]] = {}
        tree = ast.parse((root / path).read_text())
        stmts = list(tree.body)
        while stmts:
            n = stmts.pop(0)
            if isinstance(n, ast.If):  # if TYPE_CHECKING: imports
                stmts = [*n.body, *n.orelse, *stmts]
            elif isinstance(n, ast.ImportFrom) and n.module:
                for a in n.names:
                    kv = n.module.startswith("kvarena.")
                    imports[a.asname or a.name] = (module_path(n.module), a.name) if kv else ("", n.module)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    imports[a.asname or a.name.split(".")[0]] = ("", a.name)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    defs.update(x.id for x in ast.walk(t) if isinstance(x, ast.Name))
        _MODULES[key] = _Module(frozenset(defs), imports)
    return _MODULES[key]


def resolve(root: Path, path: str, name: str) -> tuple[str, str] | None:
    """Where the module-level ``name`` of ``path`` is defined: (file, name), following re-exports; ("", module) for
    a library name; None if the file neither defines nor imports it."""
    seen = set()
    while (path, name) not in seen:
        seen.add((path, name))
        m = _module(root, path)
        if name in m.defs:
            return path, name
        if name not in m.imports:
            return None
        path, name = m.imports[name]
        if not path:
            return "", name  # a library name: ("", its module)
        if not (root / path).is_file():
            return None  # a module imported from a package, not a definition
    return None


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _locals(tree: ast.AST) -> set[str]:
    """Names an excerpt binds itself: parameters, assignment and loop targets, nested defs, local imports."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = n.args
            out.update(x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(v for v in (a.vararg, a.kwarg) if v)])
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def notation_definitions(text: str) -> dict[str, tuple[list[str], str]]:
    """One-line definitions in §Notation: ``name(a, b) = expression`` in backticks -> (params, expression)."""
    body = sections(text).get("Notation", "")
    return {m.group(1): ([p.strip() for p in m.group(2).split(",") if p.strip()], m.group(3).strip())
            for m in re.finditer(r"`(\w+)\(([\w, ]*)\) = ([^`]+)`", body)}


def _canonical(params: list[str], expr: ast.expr) -> str:
    """``expr`` with the parameters renamed by position, so ``clamp(x, lo, hi)`` matches ``clamp(value, lo, hi)``."""
    names = {p: f"_{i}" for i, p in enumerate(params)}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.Name(names.get(node.id, node.id), node.ctx)

    return ast.dump(Rename().visit(expr))


def notation_problem(root: Path, path: str, name: str, params: list[str], expr: str) -> str | None:
    """A §Notation definition must be the function's whole body (after its docstring): ``return expression``."""
    try:
        fn = find_definition(ast.parse((root / path).read_text()), name)
        mine = ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        return f"§Notation defines {name} as {expr!r}, which is not a Python expression: {e}"
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))] \
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return f"§Notation defines {name} in one line, but {path} {name} is not a single return: show an excerpt"
    theirs = [a.arg for a in fn.args.args]
    if len(theirs) != len(params) or _canonical(params, mine) != _canonical(theirs, body[0].value):
        return (f"§Notation: {name}({', '.join(params)}) = {expr} is not {path}'s "
                f"{name}({', '.join(theirs)}) = {ast.unparse(body[0].value)}")
    return None


def _class_fields(node: ast.ClassDef) -> set[str]:
    out: set[str] = set()
    for s in node.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            out.add(s.target.id)
        elif isinstance(s, ast.Assign):
            out.update(t.id for t in s.targets if isinstance(t, ast.Name))
    return out


def _parsed_excerpts(text: str) -> list[tuple[str, str, ast.stmt]]:
    """(path, qualname, the definition's node) per definition shown, parsed from the document's own code."""
    out = []
    for path, quals, b in excerpt_blocks(text):
        try:
            nodes = [n for n in ast.parse(b.code).body
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        except SyntaxError:
            continue  # excerpt_problems reports it
        out += [(path, q, n) for q, n in zip(quals, nodes)]
    return out


def _prose_only(body: str) -> str:
    """``body`` without its fenced blocks: an excerpt's docstring naming a helper does not define it."""
    lines = body.split("\n")
    for b in reversed(fenced_blocks(body)):
        del lines[b.start:b.end + 1]
    return "\n".join(lines)


def self_containment_problems(text: str, root: Path = ROOT,
                              prose: dict[tuple[str, str], str] = PROSE_DEFINED) -> list[str]:
    shown = _parsed_excerpts(text)
    defined: set[tuple[str, str]] = set()  # (file, qualname) shown; a class's fields count (a callable field)
    members: set[str] = set()  # names a shown definition gives an object: methods, fields, what __init__ sets
    for path, qual, node in shown:
        defined.add((path, qual))
        members.add(qual.rsplit(".", 1)[-1])
        if isinstance(node, ast.ClassDef):
            names = {m.name for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            names |= _class_fields(node)
            defined.update((path, f"{qual}.{m}") for m in names)
            members.update(names)
        inits = [m for m in ast.walk(node) if isinstance(m, ast.FunctionDef) and m.name == "__init__"]
        members.update(t.attr for m in inits for a in ast.walk(m) if isinstance(a, (ast.Assign, ast.AnnAssign))
                       for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
                       if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self")
    state = sections(text).get("State", "")
    fields = {f for b in fenced_blocks(state) for f in re.findall(r"(?<![\w.])_\w+", b.code)}
    ops = set(re.findall(r"^### `(\w+)`", text, re.M))
    notation = notation_definitions(text)
    heads = {plain(h): _prose_only(body) for level in (2, 3) for h, body in sections(text, level).items()}

    problems: list[str] = []
    prose_ok: dict[tuple[str, str], str | None] = {}

    def prose_problem(key: tuple[str, str]) -> str | None:
        if key not in prose_ok:
            title = prose[key]
            hits = [b for h, b in heads.items() if h.startswith(title)]
            name = key[1]
            if len(hits) != 1:
                prose_ok[key] = f"PROSE_DEFINED: {key[0]} {name} points at §{title}, which is {len(hits)} sections"
            elif not re.search(rf"`[^`\n]*\b{re.escape(name)}\b[^`\n]*`", hits[0]):
                prose_ok[key] = f"PROSE_DEFINED: §{title} does not name `{name}`, which it is listed as defining"
            else:
                prose_ok[key] = None
        return prose_ok[key]

    for path, qual, node in shown:
        where = f"excerpt {path} {qual}"
        if not (root / path).is_file():
            continue  # excerpt_problems reports it
        local = _locals(node) - {node.name}
        cls = qual if isinstance(node, ast.ClassDef) else qual.rpartition(".")[0]
        needed: dict[tuple[str, str], str] = {}  # (file, name) -> how the excerpt uses it
        self_calls: set[ast.Attribute] = set()
        for n in ast.walk(node):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and cls:
                self_calls.add(f)
                if (path, f"{cls}.{f.attr}") not in defined and f.attr not in ops:
                    problems.append(f"{where} calls self.{f.attr}(), which the document does not show "
                                    f"(add an excerpt of {path} {cls}.{f.attr})")
                continue
            root_name = f
            while isinstance(root_name, ast.Attribute):
                root_name = root_name.value
            if isinstance(f, (ast.Name, ast.Attribute)):
                names = [root_name.id] if isinstance(root_name, ast.Name) else []
            else:
                names = [x.id for x in ast.walk(f) if isinstance(x, ast.Name)]
            for name in names:
                if name in local or name == "self" or name in needed.values():
                    continue
                target = resolve(root, path, name)
                if target is None:
                    if not hasattr(builtins, name):
                        problems.append(f"{where} calls {name}, which {path} neither defines nor imports")
                    continue
                if not target[0]:
                    if not _is_stdlib(target[1]):
                        problems.append(f"{where} calls {name} from {target[1]}, not the standard library")
                    continue
                needed[target] = name
        for (tpath, tname), name in needed.items():
            if (tpath, tname) in defined:
                continue
            if tname in notation:
                p = notation_problem(root, tpath, tname, *notation[tname])
                if p:
                    problems.append(f"{where}: {p}")
                continue
            if (tpath, tname) in prose:
                p = prose_problem((tpath, tname))
                if p:
                    problems.append(f"{where} calls {name}: {p}")
                continue
            problems.append(f"{where} calls {name} ({tpath} {tname}), which the document does not define: add an "
                            "excerpt of it where a reader needs it")
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n not in self_calls \
                    and n.attr.startswith("_") and not n.attr.startswith("__") \
                    and n.attr not in fields and n.attr not in members:
                problems.append(f"{where} reads {ast.unparse(n)}, hidden state: neither §State lists {n.attr} nor "
                                "does the document show its definition")
    used = {key for key in prose_ok}
    problems += [f"PROSE_DEFINED lists {p} {n}, which no excerpt calls any more: drop the entry"
                 for p, n in prose if (p, n) not in used]
    return sorted(set(problems), key=problems.index)


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


def preset_table_problems(text: str, section: str = "Model presets") -> list[str]:
    """The presets table (docs/spec-rationale.md §Model presets): entry and page bytes are what spec/layout.py
    computes, and every preset's every class has a row."""
    body = sections(text).get(section, "")
    table = next((t for t in tables(body) if t[0][:3] == ["Preset", "Class", "Kind"]), None)
    if table is None:
        return [f"§{section} has no presets table (header | Preset | Class | Kind | ...)"]
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


@pytest.fixture(scope="module")
def predicates_text() -> str:
    return PREDICATES.read_text()


def _report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s) in spec/arena.md:\n" + "\n\n".join(problems)


def test_excerpts_match_the_source(spec_text: str, predicates_text: str) -> None:
    assert excerpts(spec_text), "spec/arena.md has no excerpts"
    problems = excerpt_problems(spec_text)
    problems += [f"{PREDICATES.relative_to(ROOT)}: {p}" for p in excerpt_problems(predicates_text)]
    assert not problems, _report(problems)


def test_required_excerpts_present(spec_text: str, predicates_text: str) -> None:
    problems = missing_required_excerpts(spec_text)
    required = {"reference/invariants.py": [fn.__name__ for fn in INVARIANTS.values()]}
    problems += [p.replace("spec/arena.md", str(PREDICATES.relative_to(ROOT)))
                 for p in missing_required_excerpts(predicates_text, required)]
    assert not problems, _report(problems)


def test_every_python_block_is_excerpt_or_illustrative(spec_text: str, predicates_text: str) -> None:
    problems = unmarked_python_blocks(spec_text) + unmarked_python_blocks(predicates_text)
    assert not problems, _report(problems)


def test_spec_is_self_contained(spec_text: str, predicates_text: str) -> None:
    """Every name an excerpt of the spec or its appendix calls is defined in them, and no excerpt reads a private
    field the document does not define (the checker's negative tests: test_self_containment_checker_fails)."""
    problems = self_containment_problems(spec_text + "\n" + predicates_text)
    assert not problems, _report(problems)
    alone = self_containment_problems(spec_text)  # the spec needs its appendix only for the predicates' helpers
    assert all("reference/invariants.py" in p or "PROSE_DEFINED lists" in p for p in alone), _report(alone)


def test_every_guard_is_an_ordered_list(spec_text: str) -> None:
    problems = guard_list_problems(spec_text)
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


def test_presets_table() -> None:
    problems = preset_table_problems(RATIONALE.read_text())
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


def guard_list_problems(text: str, codes=ERROR_CODES) -> list[str]:
    """Each operation of §Operations states its **Guard** as an ordered list of assertions, in the order the code
    checks them: items ``1.``, ``2.``, ... (one per line, continued by indented lines), each written ``assertion —
    `Error`: why``, naming an error of §Errors (its code or class)."""
    body = sections(text).get("Operations")
    if body is None:
        return ["spec/arena.md has no '## Operations' section"]
    errors = set(codes) | {cls.__name__ for cls in codes.values()}
    problems = []
    for title, sub in sections("## Operations\n" + body, 3).items():
        op = plain(title)
        at = sub.find("**Guard**")
        if at < 0:
            problems.append(f"§{op}: no **Guard**")
            continue
        lines = sub[at:].split("\n")[1:]
        items: list[tuple[int, str]] = []
        for line in lines:
            m = re.match(r"^(\d+)\. (.+)$", line)
            if m:
                items.append((int(m.group(1)), m.group(2)))
            elif items and line.startswith("   ") and line.strip():
                items[-1] = (items[-1][0], items[-1][1] + " " + line.strip())
            else:
                break
        if not items:
            problems.append(f"§{op}: the **Guard** is not followed by an ordered list of assertions (1. ..., 2. ...)")
            continue
        if [n for n, _ in items] != list(range(1, len(items) + 1)):
            problems.append(f"§{op}: the guard's items are numbered {[n for n, _ in items]}, not 1..{len(items)}")
        for n, item in items:
            _, dash, rest = item.partition(" — ")
            head, colon, why = rest.partition(": ")
            named = re.findall(r"`([A-Z]\w*)`", head)
            if not dash or not named or not colon or not why.strip():
                problems.append(f"§{op}: guard item {n} ({item[:60]!r}) does not read 'assertion — `Error`: why'")
            elif any(w not in errors for w in named):
                problems.append(f"§{op}: guard item {n} names {[w for w in named if w not in errors]}, which "
                                "§Errors does not list")
    return problems


def test_no_excerpt_twice(spec_text: str, predicates_text: str) -> None:
    problems = duplicate_excerpts(spec_text + "\n" + predicates_text)
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


def _notation(ceil: str = "-(-a // b)") -> str:
    return f"## Notation\n\n`ceil_div(a, b) = {ceil}`, `clamp(x, lo, hi) = max(lo, min(x, hi))`.\n\n"


def _excerpt(path: str, *quals: str) -> str:
    return _fence(block_source(ROOT, path, list(quals)), f"<!-- excerpt: {path} {' '.join(quals)} -->")


def test_self_containment_checker_fails() -> None:
    """A check that cannot fail proves nothing: an undefined helper, an undefined method, hidden state, a wrong
    one-line definition, a library call, a stale or unfounded prose entry are each reported."""
    def check(doc: str, prose: dict[tuple[str, str], str] | None = None) -> list[str]:
        return self_containment_problems(doc, ROOT, {} if prose is None else prose)

    # a helper the document does not define; with its definitions shown, nothing is missing
    place_only = _notation() + _excerpt("reference/ladder.py", "place")
    problems = check(place_only)
    assert len(problems) == 2, problems
    assert any("calls Placement (reference/ladder.py Placement)" in p for p in problems)
    assert any("calls _Gap (reference/ladder.py _Gap)" in p for p in problems)
    assert check(place_only + _excerpt("reference/ladder.py", "Placement", "_Gap")) == []
    # without §Notation, ceil_div and clamp are undefined too; a wrong one-line definition is reported
    assert len(check(_excerpt("reference/ladder.py", "place", "Placement", "_Gap"))) == 2
    wrong = check(_notation("a // b") + _excerpt("reference/ladder.py", "place", "Placement", "_Gap"))
    assert len(wrong) == 1 and "ceil_div(a, b) = a // b is not spec/guards.py's" in wrong[0], wrong
    # a method of the excerpt's class that the document does not show
    packs = check(_excerpt("reference/arena.py", "Arena._end_packs"), {("reference/ladder.py", "EndPack"): "R"})
    assert any("calls self._barrier(), which the document does not show" in p for p in packs), packs
    # hidden state: a private field neither §State nor an excerpt defines
    new_vid = _excerpt("reference/arena.py", "Arena._new_vid")
    hidden = check(new_vid)
    assert hidden == ["excerpt reference/arena.py Arena._new_vid reads self._next_vid, hidden state: neither §State "
                      "lists _next_vid nor does the document show its definition"], hidden
    assert check("## State\n\n```text\n_next_vid   the next fresh id\n```\n\n" + new_vid) == []
    # a name from a library outside the standard library
    assert any("calls SortedList from sortedcontainers" in p
               for p in check(_excerpt("reference/arena.py", "Arena._checkpoint")))
    # a prose entry: its section must name it, and some excerpt must still need it
    split = _excerpt("spec/pools.py", "split_bytes")
    prose = {("spec/models.py", "chain"): "The chain", ("spec/layout.py", "entry_layout"): "The chain",
             ("spec/pools.py", "exact_ratio"): "The chain"}
    doc = "## The chain\n\nBands in `chain` order; `entry_layout` packs rows; `exact_ratio` is the decimal.\n\n" + split
    assert check(doc, prose) == []
    unfounded = check(doc.replace("`exact_ratio`", "exact_ratio"), prose)
    assert unfounded == ["excerpt spec/pools.py split_bytes calls exact_ratio: PROSE_DEFINED: §The chain does "
                         "not name `exact_ratio`, which it is listed as defining"], unfounded
    stale = check(doc, {**prose, ("spec/models.py", "preset"): "The chain"})
    assert stale == ["PROSE_DEFINED lists spec/models.py preset, which no excerpt calls any more: drop the entry"]


def test_guard_list_checker_fails() -> None:
    ok = ("## Operations\n\n### `free`\n\n`free(owner)`. **Guard** (`guard_free`):\n"
          "1. `owner` is hashable — `InvalidArgument`: ids key tables\n"
          "2. `owner` exists — `UnknownOwner`: a freed owner is forgotten, so a\n   second free is refused\n\n"
          "**Effect**: forget it.\n\n## Next\n")
    assert guard_list_problems(ok) == []
    prose = ok.replace("(`guard_free`):\n1.", "(`guard_free`): 1.").replace("tables\n2.", "tables; 2.")
    assert guard_list_problems(prose) == ["§free: the **Guard** is not followed by an ordered list of assertions "
                                          "(1. ..., 2. ...)"]
    assert "numbered [1, 3]" in guard_list_problems(ok.replace("\n2. ", "\n3. "))[0]
    assert "does not read" in guard_list_problems(ok.replace(": ids key tables", ""))[0]
    assert "names ['UnknownOwnr']" in guard_list_problems(ok.replace("`UnknownOwner`", "`UnknownOwnr`"))[0]
    assert guard_list_problems(ok.replace("**Guard**", "Guard")) == ["§free: no **Guard**"]


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        for doc in (SPEC, PREDICATES):
            doc.write_text(update_excerpts(doc.read_text()))
            n = len(excerpts(doc.read_text()))
            print(f"refreshed {n} excerpts in {doc.relative_to(ROOT)}; review the diff")
    else:
        sys.exit("usage: python tests/fast/test_spec.py --update")
