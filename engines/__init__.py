"""Real engines' code behind kvarena's interfaces: ``kvarena.engines.transformers`` (a transformers model's KV
and recurrent state on the arena, transformers' own paged allocator under the contract)."""
