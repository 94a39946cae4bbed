"""The machines that drive an implementation and check it after every step: the reference's own state machine
(``arena``), the lockstep machine against the reference (``lockstep``, ``batched``), and what they share: the trace
language and oracle (``harness``), one compared step (``conductor``), the invariants on an observation (``checks``),
what the steps exercised (``coverage``), the placement-limit rule and draws (``below``), the boundary scenarios
run before the random examples (``boundary``)."""
