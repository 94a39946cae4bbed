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

Relative imports are resolved against the file's package, and imports nested inside functions
count too.
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
          "simulator/vllm_real.py": ("kvarena.engines.vllm",)}
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
    assert "kvarena.spec.errors" in mods and "kvarena.reference.split" in mods  # the second is nested


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


def test_simulator_has_no_import_cycle() -> None:
    graph = simulator_graph()
    assert len(graph) >= 10
    assert not import_cycle(graph), " -> ".join(import_cycle(graph))


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
