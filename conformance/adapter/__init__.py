"""The adapter side of conformance: the protocol an allocator implements (``protocol``), ``PoolAdapter``, the
base that does the bookkeeping for a pool (``base``), and a worked adapter with its own ids (``renumbered``)."""
