"""The radix tree's recurrent-state checkpoints of the running requests, as SGLang 0.5.23 holds them.

After each prefill chunk the tree takes the request's state (``rules.mamba_radix_checkpoint_slots``): the
newest checkpoint is locked by the request; with ``rules.mamba_chunk_checkpoints`` every earlier chunk's
checkpoint stays resident too, unlocked, above KV the request still locks (*interior*). Each checkpoint is an
owner of the engine of its own (``ckpt:r<id>``, then ``ckpt:r<id>:<k>``), so it costs a state slot in the split
pools and bytes in a unified arena, and the full-attention side never counts it free.

- **Reclaimed by state allocations only**: before a state allocation (admission's slots, a checkpoint), the
  oldest interior checkpoints go while the state demand alone does not fit (``_alloc_mamba_slot`` ->
  ``evict_for_alloc(mamba_num=1)``). In split pools that is a full state pool; in a unified arena, no room
  for the slots at all. A full-attention shortfall never reaches them (SGLang evicts leaves only).
- **Freed when the request stops running** (completes or is retracted): its nodes are then unlocked leaves
  whose eviction cascades up, state included, so they are as free as the evictable KV SGLang counts free.
"""

from __future__ import annotations

from collections.abc import Callable


class StateCheckpoints:
    """Checkpoint owners per running request; ``admit(owner, slots)`` allocates one, returning False if refused."""

    def __init__(self, alloc, state_class: str, fits: Callable[[dict[str, int], int], bool],
                 admit: Callable[[str, int], bool]) -> None:
        self.alloc, self.cls, self.fits, self._admit = alloc, state_class, fits, admit
        self.owners: dict[int, list[str]] = {}  # rid -> its checkpoint owners, the newest (locked) last
        self.interior: dict[str, int] = {}  # unlocked ones, oldest first -> rid
        self.admitted = 0  # checkpoint owners admitted (not requests)
        self.refused = 0
        self.evicted = 0
        self.frees = 0

    def __contains__(self, rid: int) -> bool:
        return rid in self.owners

    def make_room(self, slots: int) -> None:
        """A state allocation of ``slots``: evict interior checkpoints, oldest first, while they do not fit."""
        while self.interior and not self.fits({self.cls: slots}, 0):
            owner, rid = next(iter(self.interior.items()))
            del self.interior[owner]
            self.owners[rid].remove(owner)
            self.alloc.free(owner)
            self.evicted += 1
            self.frees += 1

    def take(self, rid: int, slots: int) -> None:
        """The tree takes ``rid``'s state after a prefill chunk; its previous checkpoint becomes interior."""
        held = self.owners.get(rid, [])
        owner = f"ckpt:r{rid}" if not held else f"ckpt:r{rid}:{self.admitted}"
        self.make_room(slots)
        if not self._admit(owner, slots):
            self.refused += 1
            return
        self.admitted += 1
        if held:
            self.interior[held[-1]] = rid  # the lock moved to the new node
        self.owners.setdefault(rid, []).append(owner)

    def drop(self, rid: int) -> None:
        """``rid`` stopped running: its checkpoints are unlocked leaves, evictable (free)."""
        for owner in self.owners.pop(rid, ()):
            self.interior.pop(owner, None)
            self.alloc.free(owner)
            self.frees += 1
