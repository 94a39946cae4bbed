"""Static import rules between the design card's folders, checked with ast (no imports executed).

* spec/        imports nothing from kvarena.* but kvarena.spec;
* reference/   imports only kvarena.spec and kvarena.reference;
* spec/ and reference/ never import torch, triton or numpy (the reference needs only the stdlib
  and sortedcontainers);
* gpu/         never imports kvarena.reference (it implements the spec, it does not wrap the model);
* conformance/ may import spec and reference, never kvarena.cli or kvarena.replay;
* proofs/      may import spec and reference (and itself);
* engines/     may import spec, gpu, conformance, reference and itself: never simulator/ or a command;
* simulator/   may import spec, reference, itself and kvarena.text (the shared message helpers), never a
  command module, conformance/ or gpu/; its modules form no import cycle, and it (with the commands
  kvarena/simulate.py and kvarena/replay.py) imports nothing heavy at module level (matplotlib only
  inside the plotting functions), so `kvarena simulate --help` needs only sortedcontainers.

Across the whole project (every module of every folder): no import circle, and no upward import under the
layers spec < reference, gpu, kvarena.text < proofs, conformance < engines < simulator < the commands; within
conformance/ its subpackages are layered adapter < example < machine < vectors < explore < runner.

Relative imports are resolved against the file's package, and imports nested inside functions
count too (those under ``if TYPE_CHECKING:`` do not: they never run).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "triton", "numpy")


@dataclass(frozen=True)
class Rule:
    folder: str  # top-level folder, imported as kvarena.<folder>
    allowed_kvarena: tuple[str, ...] | None  # kvarena.* prefixes allowed; None: any but `banned`
    banned: tuple[str, ...] = ()  # module prefixes never allowed


RULES = [
    Rule("spec", allowed_kvarena=("kvarena.spec",), banned=HEAVY),
    Rule("reference", allowed_kvarena=("kvarena.spec", "kvarena.reference"), banned=HEAVY),
    # gpu/ implements the spec on its own: only the shared spec types, never the oracle or the harness
    Rule("gpu", allowed_kvarena=("kvarena.spec", "kvarena.gpu"), banned=("kvarena.reference",)),
    Rule("conformance", allowed_kvarena=None, banned=("kvarena.cli", "kvarena.replay")),
    Rule("proofs", allowed_kvarena=("kvarena.spec", "kvarena.reference", "kvarena.proofs")),
    Rule("simulator", allowed_kvarena=("kvarena.spec", "kvarena.reference", "kvarena.simulator", "kvarena.text"),
         banned=HEAVY),
    # real engines' code behind kvarena's interfaces: the spec's types, gpu/'s arena, the conformance machinery and
    # the reference its adapters are compared with (the SGLang adapter's floor); never a command or the simulator
    Rule("engines", allowed_kvarena=("kvarena.spec", "kvarena.gpu", "kvarena.conformance", "kvarena.reference",
                                     "kvarena.engines"),
         banned=("kvarena.cli", "kvarena.replay", "kvarena.simulator")),
]
# The simulator's real-engine columns drive other engines' code through engines/sglang and engines/vllm (optional
# extras, imported only when such a column is built: simulator/engines.py imports these two inside functions)
EXEMPT = {"simulator/sglang_real.py": ("kvarena.engines.sglang", "torch"),
          "simulator/vllm_real.py": ("kvarena.engines.vllm",),
          "simulator/transformers_real.py": ("kvarena.engines.transformers",)}
HEAVY_AT_TOP = (*HEAVY, "matplotlib", "hypothesis", "z3", "sglang")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _is_package(mod: str) -> bool:
    """``kvarena`` or a package of it (``kvarena.X.Y`` lives in the folder ``X/Y``)."""
    if mod == "kvarena":
        return True
    return mod.startswith("kvarena.") and (ROOT / mod.split(".", 1)[1].replace(".", "/")).is_dir()


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in ``source``, a module of ``package``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # `from kvarena import reference` imports kvarena.reference, `from kvarena.simulator import rules`
            # kvarena.simulator.rules: a name imported from a package may be a module of it
            if _is_package(mod):
                out.extend((node.lineno, f"{mod}.{alias.name}") for alias in node.names)
    return out


def violations(source: str, package: str, rule: Rule, where: str = "<string>") -> list[str]:
    bad = []
    for line, mod in imported_modules(source, package):
        if any(_under(mod, b) for b in rule.banned):
            bad.append(f"{where}:{line} imports {mod} (banned in {rule.folder}/)")
        elif (rule.allowed_kvarena is not None and _under(mod, "kvarena") and mod != "kvarena"
              and not any(_under(mod, p) for p in rule.allowed_kvarena)):
            bad.append(f"{where}:{line} imports {mod}; {rule.folder}/ may import only {rule.allowed_kvarena}")
    return bad


def package_of(path: Path, folder: str) -> str:
    rel = path.relative_to(ROOT / folder).with_suffix("")
    # the package a module's relative imports resolve against: its folder (also for __init__.py)
    return ".".join(["kvarena", folder, *rel.parts[:-1]])


@pytest.mark.parametrize("rule", RULES, ids=[r.folder for r in RULES])
def test_import_rules(rule: Rule) -> None:
    folder = ROOT / rule.folder
    files = sorted(folder.rglob("*.py"))
    assert files, f"{rule.folder}/ has no Python files"
    bad: list[str] = []
    for f in files:
        where = str(f.relative_to(ROOT))
        bad += [b for b in violations(f.read_text(encoding="utf-8"), package_of(f, rule.folder), rule, where)
                if not any(_under(b.split(" imports ")[1].split()[0].rstrip(";"), p) for p in EXEMPT.get(where, ()))]
    assert not bad, "\n".join(bad)


def test_reference_and_spec_are_scanned() -> None:
    """The scan sees real imports (guards against a checker that finds nothing)."""
    src = (ROOT / "reference" / "arena.py").read_text(encoding="utf-8")
    mods = {m for _, m in imported_modules(src, "kvarena.reference")}
    assert "kvarena.spec.errors" in mods and "kvarena.reference.bands" in mods
    src = (ROOT / "proofs" / "harness.py").read_text(encoding="utf-8")
    assert "kvarena.proofs.replay" in {m for _, m in imported_modules(src, "kvarena.proofs")}  # nested in a function


# =============================================================================================
# The checker catches what it should (negative self-tests on synthetic sources)

BAD_SPEC = """
import torch
from kvarena.reference.arena import Arena
from kvarena import cli
from ..reference import bands
from .errors import ArenaError

def f():
    import numpy as np
    from triton import language
"""


def test_checker_flags_synthetic_violations() -> None:
    spec = RULES[0]
    bad = violations(BAD_SPEC, "kvarena.spec", spec)
    flagged = {b.split(" imports ")[1].split()[0].rstrip(";") for b in bad}
    assert flagged == {"torch", "kvarena.reference.arena", "kvarena.cli", "kvarena.reference", "numpy",
                       "triton", "kvarena.reference.bands"}
    assert not any("kvarena.spec.errors" in b for b in bad)  # the relative import within spec is fine


def test_checker_rules_per_folder() -> None:
    by = {r.folder: r for r in RULES}
    assert violations("from kvarena.reference import arena", "kvarena.gpu", by["gpu"])
    assert not violations("from kvarena.spec import layout\nimport torch", "kvarena.gpu", by["gpu"])
    assert violations("from kvarena.conformance.adapter.protocol import Observation", "kvarena.gpu", by["gpu"])
    assert violations("import kvarena.cli", "kvarena.conformance", by["conformance"])
    assert violations("from kvarena.replay import run", "kvarena.conformance", by["conformance"])
    conf = by["conformance"]
    assert not violations("from kvarena.reference.arena import Arena", "kvarena.conformance", conf)
    assert violations("from kvarena.gpu import kernels", "kvarena.proofs", by["proofs"])
    assert not violations("from kvarena.reference import ladder\nfrom . import z", "kvarena.proofs",
                          by["proofs"])
    assert violations("import numpy", "kvarena.reference", by["reference"])
    assert violations("from kvarena.conformance import machine", "kvarena.reference", by["reference"])
    # relative imports climbing out of the package resolve to the sibling folder
    assert violations("from ..gpu import x", "kvarena.reference", by["reference"])
    assert not violations("from ..spec.layout import Kind", "kvarena.reference", by["reference"])


def test_relative_import_resolution() -> None:
    assert imported_modules("from . import a", "kvarena.spec") == [(1, "kvarena.spec"), (1, "kvarena.spec.a")]
    assert imported_modules("from .b import c", "kvarena.spec") == [(1, "kvarena.spec.b")]
    assert imported_modules("from ..gpu.k import c", "kvarena.reference") == [(1, "kvarena.gpu.k")]
    assert package_of(ROOT / "reference" / "arena.py", "reference") == "kvarena.reference"
    assert package_of(ROOT / "reference" / "__init__.py", "reference") == "kvarena.reference"


# =============================================================================================
# The simulator subsystem: no import cycle, nothing heavy at module level


def top_level_modules(source: str, package: str) -> list[str]:
    """Modules imported by the module's own top-level statements (not inside functions)."""
    tree = ast.parse(source)
    body = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
    return [m for _, m in imported_modules(ast.unparse(body), package)]


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (module -> modules it imports), or [] if there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n):], n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def simulator_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for f in sorted((ROOT / "simulator").glob("*.py")):
        name = "kvarena.simulator" if f.stem == "__init__" else f"kvarena.simulator.{f.stem}"
        mods = {m for _, m in imported_modules(f.read_text(encoding="utf-8"), "kvarena.simulator")}
        graph[name] = {m for m in mods if _under(m, "kvarena.simulator") and m != "kvarena.simulator"}
    return graph


def listed_order(doc: str) -> list[str]:
    """The modules a package docstring lists, one ``name.py`` per line, in their order."""
    return [m.group(1) for m in re.finditer(r"^ {4}(\w+)\.py\s", doc, re.MULTILINE)]


def order_violations(order: list[str], graph: dict[str, set[str]], package: str) -> list[str]:
    """Each listed module imports only modules listed above it; every module of the graph is listed."""
    bad = [f"{m}.py is not in the package's list" for m in sorted(g.rsplit(".", 1)[1] for g in graph
                                                                   if g != package) if m not in order]
    for i, m in enumerate(order):
        later = sorted(d.rsplit(".", 1)[1] for d in graph.get(f"{package}.{m}", ())
                       if d.rsplit(".", 1)[1] in order[i:])
        bad += [f"{m}.py imports {d}.py, listed below it" for d in later]
    return bad


def test_simulator_modules_import_only_those_listed_above_them() -> None:
    """simulator/__init__.py's docstring promises an order a reader can follow top down."""
    doc = (ROOT / "simulator" / "__init__.py").read_text(encoding="utf-8")
    order = listed_order(doc)
    assert len(order) >= 20 and order[0] == "arrivals"
    bad = order_violations(order, simulator_graph(), "kvarena.simulator")
    assert not bad, "\n".join(bad)
    # the check can fail: a planted upward import and an unlisted module are both reported
    planted = {**simulator_graph(), "kvarena.simulator.arrivals": {"kvarena.simulator.scheduler"},
               "kvarena.simulator.extra": set()}
    assert set(order_violations(order, planted, "kvarena.simulator")) == {
        "arrivals.py imports scheduler.py, listed below it", "extra.py is not in the package's list"}
    # and `from kvarena.simulator import calibrate` counts as importing calibrate
    assert "kvarena.simulator.calibrate" in simulator_graph()["kvarena.simulator.consistency"]


def test_cycle_finder_finds_a_planted_cycle() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert not import_cycle({"a": {"b"}, "b": {"c"}, "c": set()})


@pytest.mark.parametrize("path", ["kvarena/simulate.py", "kvarena/replay.py",
                                  *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "simulator").glob("*.py"))])
def test_nothing_heavy_at_module_level(path: str) -> None:
    package = "kvarena" if path.startswith("kvarena/") else "kvarena.simulator"
    top = top_level_modules((ROOT / path).read_text(encoding="utf-8"), package)
    bad = [m for m in top if any(_under(m, h) for h in HEAVY_AT_TOP)]
    assert not bad, f"{path} imports {bad} at module level; import it inside the function that needs it"


def test_top_level_scan_ignores_nested_imports() -> None:
    src = "import os\nfrom kvarena.simulator import rules\ndef f():\n    import matplotlib\n"
    top = top_level_modules(src, "kvarena")
    assert "os" in top and "kvarena.simulator" in top and "matplotlib" not in top
    assert top_level_modules("import matplotlib.pyplot", "kvarena") == ["matplotlib.pyplot"]


def test_simulator_rule_flags_upward_imports() -> None:
    rule = next(r for r in RULES if r.folder == "simulator")
    assert violations("from kvarena.simulate import main", "kvarena.simulator", rule)
    assert violations("from kvarena.conformance import machine", "kvarena.simulator", rule)
    assert violations("import torch", "kvarena.simulator", rule)
    assert not violations("from kvarena.text import table\nfrom . import rules", "kvarena.simulator", rule)


# =============================================================================================
# Every module of the project: no import circle, no upward import (function-level imports count; imports under
# ``if TYPE_CHECKING:`` do not, since they never run)

# Folder -> layer. A module imports only modules of its own folder or of a lower layer; folders of one layer never
# import each other (gpu/ is not built on reference/, proofs/ not on conformance/). kvarena.text, the messages and
# tables every command prints, is the one module of the command folder that lower layers use: it imports only
# spec/. "command" is everything else in kvarena/.
LAYERS = {"spec": 0, "text": 1, "reference": 1, "gpu": 1, "proofs": 2, "conformance": 2, "engines": 3,
          "simulator": 4, "command": 5}
FOLDERS = ("spec", "reference", "gpu", "conformance", "proofs", "simulator", "engines", "kvarena")
# Subpackages of one folder that are layered among themselves, lowest first (conformance/README.md §Files)
SUBPACKAGE_ORDER = {"conformance": ("adapter", "example", "machine", "vectors", "explore", "runner")}


def type_checking_lines(source: str) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks (their imports are for annotations and never run)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for n in node.body:
                lines.update(range(n.lineno, (n.end_lineno or n.lineno) + 1))
    return lines


def project_modules() -> dict[str, Path]:
    """Every module of the installed package: ``kvarena.X.Y`` -> its file (``kvarena.X`` for a package)."""
    mods: dict[str, Path] = {}
    for folder in FOLDERS:
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = list(f.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(["kvarena", *([] if folder == "kvarena" else [folder]), *parts])] = f
    return mods


def module_graph(sources: dict[str, str], packages: set[str]) -> dict[str, set[str]]:
    """module -> the project modules it imports (a name imported from a package counts as the package unless it
    is a module), from the sources of every module; ``packages`` are the modules that are packages."""
    graph: dict[str, set[str]] = {}
    for name, src in sources.items():
        pkg = name if name in packages else name.rsplit(".", 1)[0]
        skip = type_checking_lines(src)
        deps = set()
        for line, mod in imported_modules(src, pkg):
            while mod not in sources and "." in mod:
                mod = mod.rsplit(".", 1)[0]
            if mod in sources and mod != name and line not in skip:
                deps.add(mod)
        graph[name] = deps
    return graph


def project_graph() -> dict[str, set[str]]:
    mods = project_modules()
    return module_graph({m: f.read_text(encoding="utf-8") for m, f in mods.items()},
                        {m for m, f in mods.items() if f.name == "__init__.py"})


def folder_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return parts[1]
    return "text" if module == "kvarena.text" else "command"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports into a higher layer, into another folder of the same layer, or up a folder's subpackage order."""
    bad = []
    for mod, deps in sorted(graph.items()):
        a = folder_of(mod)
        for dep in sorted(deps):
            b = folder_of(dep)
            if a != b and LAYERS[b] >= LAYERS[a]:
                bad.append(f"{mod} ({a}/, layer {LAYERS[a]}) imports {dep} ({b}/, layer {LAYERS[b]})")
            order = SUBPACKAGE_ORDER.get(a, ())
            sa, sb = mod.split(".")[2:3], dep.split(".")[2:3]
            if a == b and sa and sb and sa[0] in order and sb[0] in order and order.index(sb[0]) > order.index(sa[0]):
                bad.append(f"{mod} imports {dep}: {a}/{sb[0]}/ is above {a}/{sa[0]}/ in {' < '.join(order)}")
    return bad


def test_every_module_is_in_the_graph() -> None:
    graph = project_graph()
    assert len(graph) >= 120 and {folder_of(m) for m in graph} == set(LAYERS)
    # nested imports are edges, TYPE_CHECKING ones are not
    assert "kvarena.proofs.replay" in graph["kvarena.proofs.harness"]
    assert "kvarena.conformance.machine.conductor" not in graph["kvarena.conformance.machine.below"]


def test_no_import_circle_anywhere() -> None:
    cycle = import_cycle(project_graph())
    assert not cycle, "import circle: " + " -> ".join(cycle) + "; move what both need into a module below both"


def test_no_upward_import_anywhere() -> None:
    bad = upward_imports(project_graph())
    assert not bad, "\n".join(bad)


def test_graph_checks_catch_planted_bugs() -> None:
    """Each check fails on the bug it is for: a circle through a function-level import, an upward import, a
    sideways one within a layer, a subpackage imported from below; a TYPE_CHECKING import is no edge."""
    sources = {
        "kvarena.spec.types": "from kvarena.spec import errors\n",
        "kvarena.spec.errors": "def f():\n    from kvarena.spec.types import Plan\n",
        "kvarena.reference.arena": "from kvarena.gpu.allocator import GpuArena\n",
        "kvarena.gpu.allocator": "from kvarena.conformance.machine import harness\n",
        "kvarena.conformance.machine.harness": "from ..runner import cli\n",
        "kvarena.conformance.runner.cli": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from kvarena.conformance.machine.harness import X\n"),
        "kvarena.simulator.rules": "from kvarena import text\nfrom kvarena.engines.vllm import driver\n",
        "kvarena.text": "from kvarena.spec.types import Plan\n",
        "kvarena.engines.vllm.driver": "",
    }
    graph = module_graph(sources, set())
    cycle = import_cycle(graph)
    assert cycle[0] == cycle[-1] and set(cycle) == {"kvarena.spec.errors", "kvarena.spec.types"}
    assert graph["kvarena.conformance.runner.cli"] == set()  # TYPE_CHECKING only
    bad = upward_imports(graph)
    assert len(bad) == 3, bad
    assert "kvarena.reference.arena (reference/, layer 1) imports kvarena.gpu.allocator (gpu/, layer 1)" in bad
    assert "kvarena.gpu.allocator (gpu/, layer 1) imports kvarena.conformance.machine.harness" in " ".join(bad)
    assert any("conformance/runner/ is above conformance/machine/" in b for b in bad)
