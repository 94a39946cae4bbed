"""proofs."""
