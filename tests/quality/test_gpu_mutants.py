"""Every planted bug in gpu/ (tests/quality/gpu_mutants.py) is killed, within the ci profile.

A lockstep kill runs ``run_lockstep(kvarena.gpu.allocator:make, "exact", ...)`` with the mutant in place under
the ``ci`` profile (derandomized, whatever HYPOTHESIS_PROFILE says; 100 examples, one mutant with 80 steps
instead of 50, see BUDGETS) without shrinking, and must fail a check: a Divergence or another AssertionError,
never the mutant crashing the code (a NameError, a TypeError, ... reported by the harness as "raised X") nor the
factory failing to build. The unmutated allocator passes the same budgets on the same paths: the derandomized
draws depend on the two sides' states, which agree until the mutant diverges, so these are the examples each
mutant saw until it failed, and no kill is vacuous.

A kernel kill runs the kernel file's own ``check()`` against the mutated module on each path of the mutant
(the Triton kernel under the interpreter, and the plain-torch branch); the real module passes the same checks.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton or kvarena.gpu: kernels are interpreted

import re

import pytest
from hypothesis import Phase, settings

import kvarena.gpu.allocator as allocator_mod
import kvarena.gpu.kernels as kernels
from kvarena.conformance.adapter.protocol import AdapterError
from kvarena.conformance.machine.batched import run_batched_lockstep
from kvarena.conformance.machine.lockstep import run_lockstep
from kvarena.gpu.kernels import interpreted, use_interpreter
from kvarena.spec.errors import ArenaError
from tests.quality.gpu_mutants import KERNELS, MUTANTS, REQUIRED, REQUIRED_BATCHED, applied, mutate, source_of

use_interpreter()  # in case another test module imported kvarena.gpu first, without the variable

# Shrinking is for humans reading a report; a kill only needs the first failure.
KILL_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
CI_STEPS = settings.get_profile("ci").stateful_step_count
# Examples per (path, steps per example). The kills seen need at most 66 examples, but which derandomized
# examples come first varied with the process's import history (see tests/quality/test_mutants.py), so every
# budget leaves a margin of 3x; the control runs pass the same budgets. The slowest kills: recurrent-slot-not-zeroed
# at example 52 (torch), partial-row-move 52 and zero-kernel-skips-first-word 66 (interpreter),
# withheld-freed-by-first-release 47 (torch, 80 steps).
# The batched machine (conformance/machine/batched.py) for the batched calls' mutants: kills seen at <= 19 examples,
# except stale-hole-count-after-fallback at 66-80 since rung 2 moves only the shortfall (a fallback compacts
# fewer holes). The engine-path mutants (``engine-*``, both paths) were killed within 200 examples on each path and
# survived 200 examples of the machine before its engine rules (decode_engine, free_shared, refused lanes,
# token_locs past what is held, polling by the arena itself).
BUDGETS = {("torch", CI_STEPS, "lockstep"): 300, ("interpreter", CI_STEPS, "lockstep"): 200,
           ("torch", 80, "lockstep"): 300, ("torch", CI_STEPS, "batched"): 200,
           ("interpreter", CI_STEPS, "batched"): 200}
RUNNERS = {"lockstep": run_lockstep, "batched": run_batched_lockstep}
# Exceptions that mean the mutant broke the code rather than planted a bug a check should find.
BROKEN = {"NameError", "SyntaxError", "ImportError", "ModuleNotFoundError", "AttributeError", "TypeError",
          "UnboundLocalError", "NotImplementedError", "InterpreterError", "CompilationError", "RuntimeError"}

def _paths(mutant) -> tuple[str, ...]:
    return (mutant.lockstep,) if isinstance(mutant.lockstep, str) else tuple(mutant.lockstep or ())


LOCKSTEP = [(m, p) for m in MUTANTS for p in _paths(m)]
KERNEL = [(m, p) for m in MUTANTS if m.kernel for p in m.paths]


def _budget(mutant, path: str) -> tuple[str, int, str]:
    return path, mutant.steps or CI_STEPS, mutant.machine


def _kill_settings(path: str, steps: int, machine: str) -> settings:
    return settings(settings.get_profile("ci"), max_examples=BUDGETS[(path, steps, machine)],
                    stateful_step_count=steps, phases=KILL_PHASES)


def _assert_check_failed(name: str, err: BaseException) -> None:
    assert isinstance(err, (AssertionError, ArenaError)), f"{name} crashed instead of failing a check: {err!r}"
    assert not isinstance(err, AdapterError), f"{name} broke the adapter (the factory or a return shape): {err}"
    crashed = BROKEN & set(re.findall(r"raised (\w+)", str(err).split("\ntrace")[0]))
    assert not crashed, f"{name} crashed the implementation ({crashed}) instead of failing a check: {err}"


@pytest.mark.quality
@pytest.mark.parametrize(("mutant", "path"), LOCKSTEP,
                         ids=[m.name if len(_paths(m)) == 1 else f"{m.name}-{p}" for m, p in LOCKSTEP])
def test_lockstep_kills_mutant(mutant, path: str) -> None:
    with applied(mutant, path) as factory, pytest.raises(Exception) as info:
        RUNNERS[mutant.machine](factory, "exact", _kill_settings(*_budget(mutant, path)))
    _assert_check_failed(mutant.name, info.value)


@pytest.mark.quality
@pytest.mark.parametrize(("mutant", "path"), KERNEL, ids=[f"{m.name}-{p}" for m, p in KERNEL])
def test_kernel_check_kills_mutant(mutant, path: str) -> None:
    mod = mutate(mutant)
    if path == "triton" and mutant.module in KERNELS:
        assert interpreted(getattr(mod, KERNELS[mutant.module])), "the mutated kernel is not interpreted"
    with pytest.raises(AssertionError):
        mutant.kernel(mod, path)
    mutant.kernel(mutant.module, path)  # the real kernel passes the same check


@pytest.mark.quality
@pytest.mark.parametrize(("path", "steps", "machine"), sorted(BUDGETS),
                         ids=[f"{m}-{p}-{s}-steps" for p, s, m in sorted(BUDGETS)])
def test_unmutated_allocator_passes_the_kill_budget(path: str, steps: int, machine: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The same examples the kills run pass on the real allocator: a kill is the mutant's doing."""
    if path == "torch":
        monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    RUNNERS[machine](allocator_mod.make, "exact", _kill_settings(path, steps, machine))


def test_mutants_cover_required_bugs() -> None:
    names = " ".join(m.name for m in MUTANTS)
    assert all(r in names for r in (*REQUIRED, *REQUIRED_BATCHED)), \
        sorted(r for r in (*REQUIRED, *REQUIRED_BATCHED) if r not in names)
    assert len(MUTANTS) >= 18
    for m in MUTANTS:
        assert m.lockstep or m.kernel, f"{m.name} has no kill"
        for p in _paths(m):
            assert _budget(m, p) in BUDGETS, f"{m.name}: add {_budget(m, p)} to BUDGETS"
    engine = [m for m in MUTANTS if m.name.startswith("engine-")]
    assert len(engine) >= 5 and all(set(_paths(m)) == {"torch", "interpreter"} for m in engine), \
        "each engine-path mutant is killed on the torch path and under TRITON_INTERPRET=1"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_snippet_still_present(mutant) -> None:
    """A refactor that removes a mutant's snippet must update the mutant, not retire it silently."""
    source_of(mutant)


def test_forcing_the_torch_path_takes_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch-path mutants patch ``kernels.common.interpreted``, where ``use_triton`` looks it up: a patch of a
    re-export would leave the interpreter path running and the torch-path mutants alive for the wrong reason."""
    import torch

    from kvarena.gpu.kernels import move

    cpu = torch.zeros(1)
    assert kernels.use_triton(move.move_pages_kernel, cpu)  # interpreted: the Triton path
    monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    assert not kernels.use_triton(move.move_pages_kernel, cpu)
