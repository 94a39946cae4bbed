"""``kvarena conform`` and ``kvarena vectors``: the run (``conform``), the command (``cli``), what a run
exercised (``coverage``), JUnit output (``junit``), the pytest plugin (``plugin``), Hypothesis profiles
(``profiles``)."""
