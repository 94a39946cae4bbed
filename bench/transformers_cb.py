"""transformers' continuous batching on its own paged cache (sectors) and on kvarena's arena: the same requests
at the same cache bytes, on a CPU.

    python bench/transformers_cb.py          # minutes on 2 cores: bench/results/transformers-cb-<date>.md and .json
    python bench/transformers_cb.py --smoke  # seconds (tests/transformers/test_batching.py): tiny set, one repetition

One process; tiny random-weight models built in code (gpt_oss: 2 sliding + 2 full layers; gemma3: 3 sliding + 1
full, so its sectors hold 3 full blocks); greedy decoding. Two phases per model, each one ``generate_batch`` call:

* **long**: a few long prompts beside a few short ones (the long-context phase);
* **wide**: many short prompts at once (the high-concurrency phase).

Three cache budgets (bytes) per phase, from room for everything to a budget that preempts. transformers' side
gets ``num_blocks = budget / bytes of one whole-model page`` (its data sectors are exactly that many bytes, plus
two trash sectors it adds); the arena gets ``capacity = budget``. The two sides run interleaved, in a shuffled
order, each repetition. Per run: the most requests in one forward pass, preemptions (soft resets), forward steps
to finish, generated tokens per second (wall), and host time per step inside the cache layer (admission, index
and free hooks; the same meter on both sides: ``kvarena.engines.transformers.batching.CacheStats``). Every arena
run's tokens are checked against transformers' run of the same phase and budget.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import machine_line, python_line, sh, write

os.environ.pop("TRITON_INTERPRET", None)  # the plain-torch path of every kernel wrapper: the CPU torch path

PAGE = 16
ATTN = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=1024)


def tiny_model(family: str, window: int) -> Any:
    import torch
    import transformers as tf

    if family == "gpt_oss":
        cfg = tf.GptOssConfig(**ATTN, num_hidden_layers=4, sliding_window=window, num_local_experts=4,
                              num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"] * 2)
    else:
        cfg = tf.Gemma3TextConfig(**ATTN, num_hidden_layers=4, sliding_window=window,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                               "sliding_attention"])
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return sh("uname", "-p") or "?"


def block_bytes(model: Any) -> int:
    """Bytes of one page of ``PAGE`` tokens of K and V of every layer: transformers' ``num_blocks`` unit."""
    c = model.config
    return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * model.dtype.itemsize * PAGE


def phases(smoke: bool) -> dict[str, list[list[int]]]:
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(128) for _ in range(n)]

    if smoke:
        return {"long": [prompt(96), prompt(12), prompt(96), prompt(20)],
                "wide": [prompt(rng.randrange(8, 32)) for _ in range(8)]}
    return {"long": [prompt(n) for n in (384, 24, 384, 40, 320, 16, 352, 32)],
            "wide": [prompt(rng.randrange(16, 64)) for _ in range(48)]}


def run(side: str, model: Any, inputs: list[list[int]], new_tokens: int, budget: int, max_batch: int) -> dict:
    import transformers as tf
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from kvarena.engines.transformers.batching import CacheStats, generate_batch, paged_generate_batch

    gen = tf.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    cb = ContinuousBatchingConfig(page_size=PAGE, num_blocks=budget // block_bytes(model), max_batch_tokens=max_batch)
    stats = CacheStats()
    t0 = time.perf_counter()
    if side == "arena":
        out = generate_batch(model, inputs, gen, budget, stats=stats, continuous_batching_config=cb)
    else:
        out = paged_generate_batch(model, inputs, gen, stats=stats, continuous_batching_config=cb)
    wall = time.perf_counter() - t0
    toks = {k: list(v.generated_tokens) for k, v in out.items()}
    generated = sum(map(len, toks.values()))
    if stats.arena is not None:
        assert stats.arena.used_bytes() == 0, "the arena still holds pages after the run"
    return {"side": side, "wall_s": wall, "generated": generated, "tok_s": generated / wall, "steps": stats.steps,
            "peak_batch": stats.peak_batch, "preemptions": stats.preemptions,
            "host_ms_per_step": 1e3 * stats.host_s / max(stats.steps, 1), "complete": len(toks) == len(inputs)
            and all(len(t) == new_tokens for t in toks.values()), "_tokens": toks,
            "moves": sum(stats.arena.stats["moves"].values()) if stats.arena is not None else 0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="seconds: one model, 12 short requests, one repetition")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; smoke 1)")
    p.add_argument("--window", type=int, default=64, help="sliding window of the tiny models (tokens)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default bench/results/; the smoke run writes only when given one)")
    args = p.parse_args(argv)

    import torch
    import transformers

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    start = time.perf_counter()
    reps = args.reps or (1 if args.smoke else 3)
    families = ["gpt_oss"] if args.smoke else ["gpt_oss", "gemma3"]
    new_tokens, max_batch = (8, 64) if args.smoke else (32, 256)
    # budgets in whole-model pages: room for every request at once, then two that preempt
    budgets = {"long": (48, 20, 16), "wide": (40, 14, 10)} if args.smoke else \
        {"long": (160, 60, 40), "wide": (400, 140, 70)}
    work = phases(args.smoke)
    rng = random.Random(1)
    runs: list[dict] = []
    for family in families:
        model = tiny_model(family, args.window)
        bb = block_bytes(model)
        run("arena", model, work["wide"][:2], 2, budgets["wide"][0] * bb, max_batch)  # untimed: first-call costs
        run("transformers", model, work["wide"][:2], 2, budgets["wide"][0] * bb, max_batch)
        for rep in range(reps):
            cells = [(ph, b) for ph in work for b in budgets[ph]]
            rng.shuffle(cells)
            for ph, blocks in cells:
                sides = ["transformers", "arena"]
                rng.shuffle(sides)
                got = {s: run(s, model, work[ph], new_tokens, blocks * bb, max_batch) for s in sides}
                for r in got.values():
                    r.update(family=family, phase=ph, budget=blocks * bb, blocks=blocks, rep=rep,
                             tokens_equal=r["_tokens"] == got["transformers"]["_tokens"])
                    runs.append(r)
    wall = time.perf_counter() - start
    for r in runs:
        del r["_tokens"]

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    table = ["| model | phase (requests) | budget KiB (pages) | side | peak running | preemptions | steps | tokens/s "
             "| host ms/step in cache | arena page moves | tokens equal |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    summary = []
    for family in families:
        for ph in work:
            for blocks in budgets[ph]:
                cell = [r for r in runs if r["family"] == family and r["phase"] == ph and r["blocks"] == blocks]
                by = {s: [r for r in cell if r["side"] == s] for s in ("transformers", "arena")}
                for s, rows in by.items():
                    eq = "-" if s == "transformers" else ("yes" if all(r["tokens_equal"] for r in rows) else "NO")
                    table.append(f"| {family} | {ph} ({len(work[ph])}) | {rows[0]['budget'] // 1024:,} ({blocks}) | "
                                 f"{s} | {med(rows, 'peak_batch'):.0f} | {med(rows, 'preemptions'):.0f} | "
                                 f"{med(rows, 'steps'):.0f} | {med(rows, 'tok_s'):,.0f} | "
                                 f"{med(rows, 'host_ms_per_step'):.3f} | "
                                 f"{'-' if s == 'transformers' else format(med(rows, 'moves'), '.0f')} | {eq} |")
                t, a = by["transformers"], by["arena"]
                summary.append(f"- {family} {ph} at {blocks} pages: arena/transformers tokens/s "
                               f"{med(a, 'tok_s') / med(t, 'tok_s'):.2f}x, peak running {med(a, 'peak_batch'):.0f} vs "
                               f"{med(t, 'peak_batch'):.0f}, preemptions {med(a, 'preemptions'):.0f} vs "
                               f"{med(t, 'preemptions'):.0f}, host ms/step {med(a, 'host_ms_per_step'):.3f} vs "
                               f"{med(t, 'host_ms_per_step'):.3f}")
    date = datetime.date.today().isoformat()
    cmd = "python bench/transformers_cb.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    lines = [f"# transformers continuous batching: its sectors vs kvarena's arena, {date}", "",
             f"- command: `{cmd}` (wall {wall:.0f} s)", machine_line(load),
             f"- cpu: {cpu_name()}",
             python_line() + f", torch {torch.__version__}, transformers {transformers.__version__}, "
             f"torch intra-op threads {torch.get_num_threads()}",
             f"- models: tiny random-weight gpt_oss (2 sliding + 2 full layers) and gemma3 (3 sliding + 1 full), "
             f"hidden 64, 2 KV heads of 16, fp32, sliding window {args.window}; page {PAGE} tokens (one whole-model "
             f"page = {block_bytes(tiny_model(families[0], args.window)) // 1024} KiB); greedy, {new_tokens} new "
             f"tokens per request; max_batch_tokens {max_batch}; {reps} interleaved repetitions, medians",
             f"- phases: long = prompts of {sorted(map(len, work['long']))} tokens; wide = {len(work['wide'])} "
             f"prompts of {min(map(len, work['wide']))}-{max(map(len, work['wide']))} tokens", "", *table, "",
             "## Summary (medians)", "", *summary, ""]
    text = "\n".join(lines)
    out = args.out if args.out is not None else (None if args.smoke else Path(__file__).parent / "results")
    if out is None:
        print(text)
    else:
        name = f"transformers-cb-{date}" + ("-smoke" if args.smoke else "")
        write(out, name + ".md", text)
        (out / (name + ".json")).write_text(json.dumps({"date": date, "command": cmd, "load": load, "wall_s": wall,
                                                        "window": args.window, "page": PAGE, "runs": runs}, indent=1))
    bad = [r for r in runs if r["side"] == "arena" and not (r["tokens_equal"] and r["complete"])]
    if bad:
        print(f"{len(bad)} arena runs differ from transformers' tokens or are incomplete", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
