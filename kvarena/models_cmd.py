"""``kvarena models``: the presets, their classes and exact byte geometry."""

from __future__ import annotations

import argparse

from kvarena.spec.layout import entry_layout, page_bytes
from kvarena.spec.models import PRESETS, TOY_MODELS, preset


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list model presets and their entry / page geometry",
                       description="List every model preset: its state classes (full / window / recurrent), "
                                   "rows per entry, entry and page bytes, and the numbers that are assumptions.")
    p.add_argument("name", nargs="?", help="one preset to show in detail (rows and offsets)")
    p.add_argument("--page-size", type=int, default=64, help="tokens per page of token classes (default 64)")
    p.add_argument("--toys", action="store_true", help="include the toy geometries used by tests")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list(PRESETS) + (list(TOY_MODELS) if args.toys else [])
    print(f"{'model':<22} {'class':<8} {'kind':<10} {'rows':>5} {'entry B':>12} {'page B':>14}")
    for name in names:
        m = preset(name)
        for c in m.classes:
            lay = entry_layout(c)
            print(f"{m.name:<22} {c.name:<8} {c.kind.value:<10} {len(c.rows):>5} {lay.entry_bytes:>12,} "
                  f"{page_bytes(c, args.page_size):>14,}")
        if args.name:
            print(f"  source: {m.source}")
            for a in m.assumptions:
                print(f"  assumption: {a}")
            for c in m.classes:
                for s in entry_layout(c).slots[:8]:
                    print(f"  {c.name}: L{s.row.layer} {s.row.part} {s.row.shape} {s.row.dtype} @ {s.offset}")
                if len(c.rows) > 8:
                    print(f"  {c.name}: ... {len(c.rows) - 8} more rows")
    return 0
