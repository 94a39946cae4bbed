"""Shared spec types: the vocabulary every implementation (reference, gpu, adapters) may import."""
