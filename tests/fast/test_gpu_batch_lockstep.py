"""The batched lockstep rules (conformance/machine/batched.py) at ``exact``: gpu/'s ``admit_batch`` / ``extend_batch`` /
``free_batch``, event users, ``token_locs`` and padded ``translate_tokens`` against the reference's sequential
calls, on the plain-torch path and with the Triton kernels under TRITON_INTERPRET=1."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import pytest
from hypothesis import settings

import kvarena.gpu.kernels as kernels
from kvarena.conformance.machine.batched import BATCH_RULES, batched_lockstep_for, run_batched_lockstep
from kvarena.gpu.allocator import make
from kvarena.gpu.kernels import use_interpreter

use_interpreter()


def _settings(examples: int) -> settings:
    return settings(settings.get_profile("ci"), max_examples=examples)


@pytest.mark.parametrize("path", ["torch", "interpreter"])
def test_batched_rules_exact(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "torch":
        monkeypatch.setattr(kernels.common, "interpreted", lambda kernel: False)
    run_batched_lockstep(make, "exact", _settings(40 if path == "torch" else 15))


def test_the_machine_has_every_batched_rule() -> None:
    machine = batched_lockstep_for(make, "exact")
    for name in BATCH_RULES:
        assert callable(getattr(machine, name)), name
    assert hasattr(machine, "admit") and hasattr(machine, "compact"), "the sequential alphabet is kept"
