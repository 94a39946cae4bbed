"""``kvarena conform`` and ``kvarena vectors``: the run (``conform``), the command (``cli``), JUnit output
(``junit``), the pytest plugin (``plugin``), Hypothesis profiles (``profiles``)."""
