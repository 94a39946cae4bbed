"""The witness instance the proof loop searches and the reference replays (harness.py finds, replay.py rebuilds).

Its own module so that replay.py, which harness.py runs, imports none of harness.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from kvarena.proofs import model as M
from kvarena.proofs import transitions as T

# The witness instance: toy-tri with page_size 4 and an 8-token context (the replay builds this arena).
WITNESS_CONFIG = {"capacity": 2048, "page_size": 4, "max_context_len": 8, "model": "toy-tri",
                  "P": (64, 512, 256), "TOP": 8, "NE": (1, 4, 4), "NR": (2, 4, 4), "D": (1, 2, 2), "Q": 1,
                  "REC": True, "R": 1}
WITNESS_DOMAIN = {"band": range(3), "slot": range(10), "vid": range(8), "owner": range(3), "user": range(3),
                  "entry": range(5), "row": range(5)}
# Invariant IDs with no Z3 obligation, and why (proofs/README.md, Obligations); ``run`` leaves them out.
NOT_MODELLED = {
    "INV-REFUSAL-IS-NOOP": (
        "a relation between the state before and after a refused call, not a property of one state: the model's "
        "transitions are their guarded cases only (a refused call has no successor), so Inv ∧ T ⇒ ID' cannot "
        "state it. What decides it is the order of the reference's code (every check before the first write, a "
        "free and its free-time plan in one commit), checked by reference/invariants.py::check_refusal_is_noop "
        "in every state the conformance machine reaches, by the pickle compare after every case of "
        "tests/fast/test_errors.py, and by tests/fast/test_validate.py for every validator rule"),
    "INV-CONTENT-FOLLOWS-VID": (
        "a property of values and history: a row reads its last write. The model abstracts content to one Bool per "
        "(band, slot, entry, row) (a tag was written there), so a tag's identity, and which write was last, cannot "
        "be stated. Its structural half is proved: INV-PAGE-ATOMIC's rows-at-live (model.py::rows_at_live: content "
        "only at live slots, so a hand-out of a hole or gap slot starts empty, i.e. reads 0) and rows-in-layout hold "
        "after every transition, and prove_content_transport proves that a hand-out leaves no row at its slot and "
        "a move carries every row to the destination. The value half is checked by "
        "reference/invariants.py::check_content_follows_vid in every state the machine reaches and by the "
        "conformance harness, which keeps every write, reads every written row of every live page after every "
        "step, and reads every unwritten row of the pages a step handed out or moved as 0"),
}


@dataclass
class Witness:
    """A satisfying assignment of a witness query, with what the replay needs to rebuild it."""

    model: z3.ModelRef
    config: M.Config
    pre: M.State
    step: T.Step | None
    transition: str
