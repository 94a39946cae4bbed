"""Adapters that put allocators nobody here wrote under the conformance harness (see sglang.py)."""
