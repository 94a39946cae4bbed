"""Exhaustive exploration of small arenas: every state reachable within the bounds, each checked (README.md)."""
