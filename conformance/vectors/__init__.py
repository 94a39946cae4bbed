"""Conformance vectors: the committed ``*.jsonl`` traces beside this file (FORMAT.md), how they are replayed
(``replay``) and the scenarios that write them (``scenarios`` and one module per family of vectors)."""
