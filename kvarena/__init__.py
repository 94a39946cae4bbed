"""kvarena: the formally specified contract for the unified KV-cache arena of hybrid LLMs."""

__version__ = "0.1.0"
