"""gpu/arena.py: typed views over the byte tensor, and tags stored as real row bytes."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import random

import pytest
import torch

from kvarena.gpu.arena import TORCH_DTYPES, DeviceArena
from kvarena.gpu.kernels import use_interpreter
from kvarena.spec.errors import InvariantViolation
from kvarena.spec.layout import entry_layout
from kvarena.spec.models import ArenaConfig, preset

use_interpreter()


def _arena(model: str, capacity: int, page_size: int = 4) -> DeviceArena:
    return DeviceArena(ArenaConfig(preset(model), capacity, page_size=page_size, max_context_len=16))


@pytest.mark.parametrize("model,capacity,page_size", [("toy-tri", 3000, 2), ("toy-tri", 4096, 4),
                                                      ("kimi-k3", 3 * 1990656 + 1000, 64)])
def test_views_alias_the_right_bytes(model: str, capacity: int, page_size: int) -> None:
    """Every row view has the row's dtype and shape, one element per entry on the grid and on through the padding
    entry (a padded lane indexes it), and writing one element changes exactly the bytes at
    entry * entry_bytes + row_offset; the padding entry's bytes lie past capacity."""
    a = _arena(model, capacity, page_size)
    rng = random.Random(capacity)
    for c in a.classes.values():
        layout = entry_layout(c)
        views = a.views(c.name)
        assert list(views) == [(s.row.layer, s.row.part) for s in layout.slots]
        n_entries = a.pad_entry(c.name) + 1
        assert n_entries > a.top[c.name] * a.epp[c.name] and (n_entries - 1) * layout.entry_bytes >= a.capacity
        assert n_entries * layout.entry_bytes <= min(a.dump_slot[n] * a.page_bytes[n] for n in a.classes)
        for i, slot in enumerate(layout.slots):
            v = views[(slot.row.layer, slot.row.part)]
            assert v.dtype == TORCH_DTYPES[slot.row.dtype] and tuple(v.shape) == (n_entries, *slot.row.shape)
            assert v.stride(0) * v.element_size() == layout.entry_bytes
            if not n_entries or (i > 3 and i != len(layout.slots) - 1):  # bytes: first rows and the last
                continue
            e = n_entries - 1 if i == 0 else rng.randrange(n_entries)  # the padding entry, then any
            # The arena starts zeroed and every noise byte is nonzero, so "exactly these bytes changed" is a
            # count of nonzero bytes plus the window's contents: a reduction, where a clone and a diff of a
            # 1.7 GiB arena took most of a minute.
            noise = torch.randint(1, 255, (slot.row.nbytes,), dtype=torch.uint8)
            v[e] = noise.view(v.dtype).view(v.shape[1:])
            lo = e * layout.entry_bytes + slot.offset
            assert torch.equal(a.raw[lo:lo + slot.row.nbytes], noise)
            assert int(torch.count_nonzero(a.raw)) == slot.row.nbytes
            a.raw[lo:lo + slot.row.nbytes] = 0


def test_tags_round_trip_through_every_dtype() -> None:
    """Tags of every magnitude round-trip through bf16 / fp32 rows, whose bytes are then NaN and inf patterns
    as often as numbers: a copy that canonicalised floats would break them."""
    a = _arena("toy-tri", 4096)
    tags = [0, 1, -1, 2**63 - 1, -2**63, 0x7FC07FC07FC07FC0, 0x7F800000, *random.Random(3).sample(range(2**62), 20)]
    for cls in a.classes:
        for row in range(len(a.layouts[cls].slots)):
            for i, tag in enumerate(tags):
                slot, entry = i % a.top[cls], i % a.epp[cls]
                a.write_tag(cls, slot, 1000 + i, entry, row, tag)
                assert a.read_tag(cls, slot, 1000 + i, entry, row) == tag


def test_zeroed_bytes_read_as_tag_zero_and_foreign_bytes_are_caught() -> None:
    a = _arena("toy-tri", 4096)
    assert a.read_tag("state", 3, 7, 0, 1) == 0  # zeroed state reads 0, whatever the page
    a.write_tag("state", 3, 7, 0, 1, 12345)
    assert a.read_tag("state", 3, 8, 0, 1) != 12345, "another page's bytes must not decode to its tag"
    a.raw[3 * 64 + 16 + 5] ^= 0x10  # flip one bit of the ssm row (row 1 starts at byte 16 of the entry)
    with pytest.raises(InvariantViolation, match="INV-PAGE-ATOMIC"):
        a.read_tag("state", 3, 7, 0, 1)
