"""``kvarena models``: the presets, their classes and exact byte geometry."""

from __future__ import annotations

import argparse

from kvarena.spec.layout import entry_layout, page_bytes
from kvarena.spec.models import PRESETS, TOY_MODELS, ModelSpec, preset
from kvarena.text import UsageError, check_model, check_page_size, table

EPILOG = """\
columns: rows = tensors per entry (one per layer and part: k, v, conv, ssm, ...); entry B = bytes of one
token's (or one recurrent state's) rows; page B = bytes of one page: --page-size entries for full and
window classes, one entry for a recurrent class.

examples:
  kvarena models                      every preset
  kvarena models qwen3.5-4b           one preset: its source, assumptions and row offsets
  kvarena models --page-size 16       page bytes at 16 tokens per page
  kvarena models --hf-config path/to/config.json
                                      your own model: the layout kvarena derives from a transformers
                                      config.json (needs the 'transformers' extra; nothing is downloaded),
                                      or the reason the arena refuses it
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list model presets and their entry / page geometry",
                       description="List every model preset: its state classes (full / window / recurrent), "
                                   "rows per entry, entry and page bytes, and the numbers that are assumptions.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="one preset to show in detail (rows and offsets)")
    p.add_argument("--page-size", type=int, default=64,
                   help="tokens per page of token classes: a power of two (default 64)")
    p.add_argument("--toys", action="store_true", help="include the toy geometries used by tests")
    p.add_argument("--hf-config", metavar="PATH",
                   help="a transformers config.json (or a folder holding one): show the layout kvarena derives "
                        "from it (kvarena.engines.transformers.model_layout)")
    p.set_defaults(func=run)


def _model(name: str) -> ModelSpec:
    check_model(name, toys=True)
    return preset(name)


def _hf_model(path: str) -> ModelSpec:
    from kvarena.engines.transformers.layout import load_config, model_layout
    from kvarena.spec.errors import ConfigError

    try:
        return model_layout(load_config(path))
    except ConfigError as e:
        raise UsageError(f"--hf-config {path}: {e}") from None


def run(args: argparse.Namespace) -> int:
    if args.hf_config and args.name:
        raise UsageError("give a preset name or --hf-config, not both")
    names = [args.name] if args.name else list(PRESETS) + (list(TOY_MODELS) if args.toys else [])
    check_page_size(args.page_size)
    models = [_hf_model(args.hf_config)] if args.hf_config else [_model(n) for n in names]
    rows = [(m.name, c.name, c.kind.value, len(c.rows), entry_layout(c).entry_bytes, page_bytes(c, args.page_size))
            for m in models for c in m.classes]
    print(table(("model", "class", "kind", "rows", "entry B", "page B"), rows, keep=2, align="lllrrr"))
    if args.name or args.hf_config:
        m = models[0]
        print(f"\nsource: {m.source}")
        for a in m.assumptions:
            print(f"assumption: {a}")
        for c in m.classes:
            for s in entry_layout(c).slots[:8]:
                print(f"  {c.name}: L{s.row.layer} {s.row.part} {s.row.shape} {s.row.dtype} @ {s.offset}")
            if len(c.rows) > 8:
                print(f"  {c.name}: ... {len(c.rows) - 8} more rows")
    return 0
