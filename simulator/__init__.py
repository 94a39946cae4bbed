"""kvarena's capacity simulator: serving-engine scheduling over a KV allocator, with a modeled clock.

One concept per module, each importing only those above it in this list:

    arrivals.py     Arrival, and the arrival processes: trace, saturated, closed loop, Poisson; lengths
    rules.py        SGLang 0.5.23's and vLLM 0.33.0's scheduler rules, one named function each, cited,
                    SchedulerModel (the rules as options, SGLang's values by default) and the rule sets
    costmodel.py    StepWork and the H200 roofline that turns a step's work into modeled seconds
    pager.py        per-request page bookkeeping over an engine (tokens in, page demands out)
    ceiling.py      the placement limit: the full band's planned peak while a new window page lives
    checkpoints.py  the radix tree's per-chunk state checkpoints (unlocked, reclaimed by state allocations)
    prefix.py       the prefix (radix) cache model: entries share pages, copy state, evict when unlocked
    result.py       RunResult, what one run measured
    scheduler.py    the step loop: admission, prefill chunks, decode, retraction
    vllm_model.py   the vLLM-style pool model (one page size, state padded to a page)
    sglang_real.py  SGLang 0.5.23's real split and unified allocators (byte buffer on torch's meta device)
    vllm_real.py    vLLM 0.33.0's real KVCacheManager, configured by vLLM's own planning
    transformers_real.py  transformers 5.23.0's real sector pool (CachePool), through its conformance adapter
    engines.py      the engines under test behind one interface: kvarena's arena, split pools, vLLM model,
                    and the real engines (optional extras, skipped with one line when missing)
    budget.py       the KV budget of one H200 (replay's arithmetic, SGLang's profile)
    workloads.py    the published presets, trace files, length distributions, calibrated budgets
    mixed_trace.py  ``kvarena replay``'s built-in three-phase trace
    report.py       outcomes, latency percentiles, the published comparison, table and JSON
    series.py       time series for the plots
    simulation.py   one workload through every configuration
    calibrate.py    fit a preset's budget on its published split figure
    plots.py        PNGs (matplotlib, imported inside its functions)
    consistency.py  whether one budget reproduces a published pair (both columns over a grid of budgets)
    matrix.py       every allocator under every rule set (SGLang's, vLLM's), and the gap split by rule group

Adding an engine touches ``engines.py`` (a builder and an ``EngineKind``; a real engine's adapter in a module
of its own); adding a rule touches ``rules.py`` (the rule and its option) and the step of ``scheduler.py`` that
applies it. The commands (``kvarena/simulate.py``, ``kvarena/replay.py``) only parse and print.
tests/fast/test_layering.py holds this list to the imports.
"""
