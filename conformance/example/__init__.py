"""A worked example for adapter authors: a third-party pool (pool.py, which knows nothing of kvarena)
and its adapter (adapter.py, on kvarena.conformance.adapter.base.PoolAdapter).

    kvarena conform --impl kvarena.conformance.example.adapter:make
    kvarena conform --impl kvarena.conformance.example.adapter:make_buggy   # the planted bug: exit 1
"""
