"""kvarena.reference: the executable model of spec/arena.md (pure Python, deterministic)."""
