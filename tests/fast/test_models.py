"""Model presets, entry layouts, sizing and refusals (spec/arena.md §Layouts, §Configuration and refusals)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from kvarena.reference.arena import Arena
from kvarena.reference.invariants import check_all
from kvarena.reference.split import SplitPools
from kvarena.spec.errors import AdmissionRejectedError, CapacityTooSmallError, ConfigError, MisalignedRowError
from kvarena.spec.layout import (
    DTYPE_BYTES,
    ENTRY_ALIGN,
    ROW_ALIGN,
    Kind,
    Row,
    StateClass,
    align_up,
    entries_per_page,
    entry_layout,
    page_bytes,
)
from kvarena.spec.models import (
    EXPECTED_BYTES,
    PRESETS,
    TOY_MODELS,
    ArenaConfig,
    GiB,
    ModelSpec,
    chain,
    dsa_index_rows,
    mha_rows,
    preset,
    summarize,
    validate_model,
    worst_case_demand,
)
from kvarena.spec.pools import exact_ratio, float_hints, split_bytes, split_regions

ALL = sorted(PRESETS) + sorted(TOY_MODELS)


# =============================================================================================
# Entry bytes and layouts


@pytest.mark.parametrize("name", sorted(EXPECTED_BYTES))
def test_entry_bytes_match_published_figures(name: str) -> None:
    model = preset(name)
    got = {c.name: entry_layout(c).entry_bytes for c in model.classes}
    assert got == EXPECTED_BYTES[name]


def test_every_published_figure_has_a_preset() -> None:
    assert set(EXPECTED_BYTES) <= set(PRESETS)
    # no published figure: kimi-k3 (DSA geometry assumed); hymba-1.5b (bytes checked by hand from its config below)
    assert set(PRESETS) - set(EXPECTED_BYTES) == {"kimi-k3", "hymba-1.5b"}


@pytest.mark.parametrize("name", ALL)
def test_layout_alignment_and_no_overlap(name: str) -> None:
    for c in preset(name).classes:
        lay = entry_layout(c)
        assert lay.entry_bytes % ENTRY_ALIGN == 0 and lay.entry_bytes > 0
        assert [s.row for s in lay.slots] == list(c.rows)  # declaration order kept
        end = 0
        for s in lay.slots:
            assert s.offset % ROW_ALIGN == 0, f"{c.name} {s.row} at offset {s.offset}"
            assert s.row.nbytes % ROW_ALIGN == 0
            assert s.offset >= end, f"{c.name}: {s.row} overlaps the row before it"
            end = s.offset + s.row.nbytes
        assert end <= lay.entry_bytes
        assert lay.payload_bytes + lay.padding_bytes == lay.entry_bytes
        assert 0 <= lay.padding_bytes < ENTRY_ALIGN


def test_layout_pads_rows_and_entry() -> None:
    # 16 B + 48 B + 16 B rows: offsets 0, 16, 64; 80 B payload -> 96 B entry
    c = StateClass("x", Kind.FULL, (Row(0, "a", (8,), "bf16"), Row(0, "b", (12,), "fp32"),
                                     Row(1, "c", (16,), "fp8")))
    lay = entry_layout(c)
    assert [s.offset for s in lay.slots] == [0, 16, 64]
    assert lay.payload_bytes == 80 and lay.entry_bytes == 96 and lay.padding_bytes == 16


@pytest.mark.parametrize(("value", "alignment", "expected"), [(0, 16, 0), (1, 16, 16), (16, 16, 16),
                                                               (17, 32, 32), (33, 32, 64)])
def test_align_up(value: int, alignment: int, expected: int) -> None:
    assert align_up(value, alignment) == expected


def test_page_bytes_per_kind() -> None:
    m = preset("toy-tri")
    assert entries_per_page(m.cls("full"), 4) == 4
    assert entries_per_page(m.cls("window"), 4) == 4
    assert entries_per_page(m.cls("state"), 4) == 1  # a recurrent slot is one entry
    assert page_bytes(m.cls("full"), 4) == 4 * 64
    assert page_bytes(m.cls("state"), 4) == 64
    cfg = ArenaConfig(m, capacity=4096, page_size=4)
    assert cfg.page_bytes("window") == 4 * 128


def test_bytes_per_token() -> None:
    m = preset("gpt-oss-20b")
    assert m.bytes_per_token(Kind.FULL) == 24576 and m.bytes_per_token(Kind.WINDOW) == 24576
    assert m.bytes_per_token(Kind.RECURRENT) == 0


# =============================================================================================
# Geometry details


def test_kimi_k3_full_class_holds_dsa_index_rows() -> None:
    k3 = preset("kimi-k3")
    full, state = k3.cls("full"), k3.cls("state")
    mla_layers = sorted({r.layer for r in full.rows if r.part == "latent"})
    assert len(mla_layers) == 24 and mla_layers[-1] == 92  # 3:1 KDA:MLA, the last layer is full
    idx_k = [r for r in full.rows if r.part == "index_k"]
    idx_s = [r for r in full.rows if r.part == "index_scale"]
    assert sorted(r.layer for r in idx_k) == mla_layers == sorted(r.layer for r in idx_s)
    assert all(r.dtype == "fp8" and r.nbytes == 128 for r in idx_k)
    assert all(r.dtype == "fp32" and r.nbytes == 16 for r in idx_s)
    assert not any(r.part.startswith("index") for r in state.rows)
    assert not set(mla_layers) & {r.layer for r in state.rows}
    # 24 layers x (576 bf16 latent + 128 B key + 16 B scale)
    assert entry_layout(full).entry_bytes == 24 * (576 * 2 + 128 + 16) == 31104
    assert any("DSA" in s for s in k3.assumptions)


def test_fp8_rows_are_uint8_stored() -> None:
    assert DTYPE_BYTES["fp8"] == DTYPE_BYTES["uint8"] == 1
    assert Row(0, "k", (8, 128), "fp8").nbytes == 1024
    rows = dsa_index_rows([0, 1], index_head_dim=64)
    assert [r.nbytes for r in rows] == [64, 16, 64, 16]


def test_layer_partition_of_presets() -> None:
    """Every layer of a preset appears in exactly one class (attention or state, never both)."""
    expected_layers = {"gpt-oss-20b": 24, "gpt-oss-120b": 36, "qwen3.5-4b": 32, "qwen3-next-80b-a3b": 48,
                       "kimi-linear-48b-a3b": 27, "kimi-k3": 93, "jamba-1.5-mini": 32, "gemma-3-27b": 62}
    for name, n in expected_layers.items():
        owner: dict[int, str] = {}
        for c in preset(name).classes:
            for layer in {r.layer for r in c.rows}:
                assert owner.setdefault(layer, c.name) == c.name, f"{name}: layer {layer} in two classes"
        assert sorted(owner) == list(range(n)), name


def test_presets_name_their_sources() -> None:
    for name in PRESETS:
        m = preset(name)
        assert m.name == name and m.source and m.max_context_len > 0
        validate_model(m)


# =============================================================================================
# Chain order


def test_chain_order_recurrent_windows_longest_first_full() -> None:
    rows = mha_rows([0], kv_heads=1, head_dim=8)
    m = ModelSpec("mix", (
        StateClass("full", Kind.FULL, rows),
        StateClass("w128", Kind.WINDOW, rows, window=128),
        StateClass("state", Kind.RECURRENT, rows),
        StateClass("w4k", Kind.WINDOW, rows, window=4096),
        StateClass("w1k", Kind.WINDOW, rows, window=1024),
    ), max_context_len=8192)
    assert [c.name for c in chain(m)] == ["state", "w4k", "w1k", "w128", "full"]
    a = Arena(ArenaConfig(m, capacity=1 << 24, page_size=16))
    assert [a.bands[n].role.value for n in a.order] == ["low", "float", "float", "float", "high"]
    check_all(a)


@pytest.mark.parametrize("name", ALL)
def test_chain_order_of_presets(name: str) -> None:
    order = chain(preset(name))
    kinds = [c.kind for c in order]
    assert kinds[-1] is Kind.FULL
    assert kinds == sorted(kinds, key=[Kind.RECURRENT, Kind.WINDOW, Kind.FULL].index)
    windows = [c.window for c in order if c.kind is Kind.WINDOW]
    assert windows == sorted(windows, reverse=True)


# =============================================================================================
# Worst-case demand and the feasibility floor


def test_worst_case_demand() -> None:
    toy = ArenaConfig(preset("toy-tri"), capacity=4096, page_size=4, max_context_len=16)
    assert worst_case_demand(toy) == {"full": 4, "window": 3, "state": 1}  # window 8 -> ceil(8/4) + 1
    short = ArenaConfig(preset("toy-tri"), capacity=4096, page_size=4, max_context_len=5)
    assert worst_case_demand(short) == {"full": 2, "window": 2, "state": 1}  # capped at the full pages
    assert worst_case_demand(ArenaConfig(preset("gpt-oss-20b"), capacity=GiB)) == {"full": 2048, "window": 3}
    assert worst_case_demand(ArenaConfig(preset("gemma-3-27b"), capacity=GiB)) == {"full": 2048, "window": 17}
    assert worst_case_demand(ArenaConfig(preset("kimi-linear-48b-a3b"), capacity=GiB)) == {"full": 16384,
                                                                                         "state": 1}


@pytest.mark.parametrize("name", [n for n in sorted(PRESETS) if len(preset(n).classes) == 2])
def test_feasibility_floor_is_exact_for_two_band_presets(name: str) -> None:
    """The smallest arena that holds one worst-case request: the floor check is tight."""
    probe = ArenaConfig(preset(name), capacity=GiB)
    worst = worst_case_demand(probe)
    need = sum(n * probe.page_bytes(c) for c, n in worst.items())
    high = chain(probe.model)[-1].name
    p_high = probe.page_bytes(high)
    fits = -(-need // p_high) * p_high  # the high band's grid must reach the top
    a = Arena(ArenaConfig(probe.model, capacity=fits))
    a.admit("worst", worst)
    assert a.free_bytes() == fits - need
    check_all(a)
    with pytest.raises(CapacityTooSmallError):
        Arena(ArenaConfig(probe.model, capacity=need - 1))


# =============================================================================================
# Split-pool sizing


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize(("swa", "mamba"), [(0.8, 0.9), (0.5, 0.25), (1.0, 3.0)])
def test_split_bytes(name: str, swa: float, mamba: float) -> None:
    cap = 100 * GiB
    cfg = ArenaConfig(preset(name), capacity=cap, swa_full_tokens_ratio=swa, mamba_full_memory_ratio=mamba)
    sizes = split_bytes(cfg)
    assert set(sizes) == {c.name for c in cfg.model.classes}
    assert all(v > 0 for v in sizes.values())
    assert sum(sizes.values()) == cap  # the full pool takes the rest: nothing lost
    classes = {c.kind: c for c in cfg.model.classes}
    rest = cap
    if Kind.RECURRENT in classes:
        state = classes[Kind.RECURRENT].name
        assert sizes[state] == cap * exact_ratio(mamba) // (1 + exact_ratio(mamba))  # mamba_mem / kv_mem = ratio
        assert sizes[state] / (cap - sizes[state]) == pytest.approx(mamba, rel=1e-9)
        rest -= sizes[state]
    full = classes[Kind.FULL]
    f_entry = entry_layout(full).entry_bytes
    windows = [c for c in cfg.model.classes if c.kind is Kind.WINDOW]
    full_tokens = rest // (f_entry + exact_ratio(swa) * sum(entry_layout(w).entry_bytes for w in windows))
    for w in windows:
        w_entry = entry_layout(w).entry_bytes
        assert sizes[w.name] % w_entry == 0
        assert sizes[w.name] // w_entry == full_tokens * exact_ratio(swa) // 1  # windows hold ratio x full tokens
    assert sizes[full.name] // f_entry >= full_tokens
    if windows:
        w0 = windows[0]
        ratio = (sizes[w0.name] / entry_layout(w0).entry_bytes) / (sizes[full.name] / f_entry)
        assert ratio == pytest.approx(swa, rel=1e-4)


@pytest.mark.parametrize("name", ALL)
def test_split_regions_are_ordered_aligned_disjoint(name: str) -> None:
    cfg = ArenaConfig(preset(name), capacity=100 * GiB if name in PRESETS else 1 << 16, page_size=64
                      if name in PRESETS else 4, max_context_len=None if name in PRESETS else 16)
    regions = split_regions(cfg)
    sizes = split_bytes(cfg)
    end = 0
    for c in chain(cfg.model):
        lo, hi = regions[c.name]
        p = cfg.page_bytes(c.name)
        assert lo % p == 0 and hi % p == 0 and lo >= end and hi <= cfg.capacity
        assert hi - lo <= sizes[c.name] and hi - lo > sizes[c.name] - 2 * p  # loses under two pages
        end = hi


def test_split_sizing_is_exact_rational_arithmetic() -> None:
    """A ratio is the decimal it is written as; no binary rounding decides a byte. At 3264 B and mamba ratio 0.7,
    3264 * 7 / 17 = 1344 exactly, while ``int(3264 * 0.7 / 1.7)`` is 1343 and would open the window float a page
    lower (the float-hint-exact vector)."""
    assert exact_ratio(0.8) == Fraction(4, 5) and exact_ratio(0.7) == Fraction(7, 10) and exact_ratio(3) == 3
    assert exact_ratio(Fraction(1, 3)) == Fraction(1, 3)
    cfg = ArenaConfig(preset("toy-tri"), 3264, 1, mamba_full_memory_ratio=0.7, max_context_len=16)
    assert int(3264 * 0.7 / 1.7) == 1343  # what the floating-point formula gave
    assert split_bytes(cfg)["state"] == 1344
    assert float_hints(cfg) == {"window": 1408} == Arena(cfg).hints


def test_split_pools_hold_what_split_bytes_says() -> None:
    cfg = ArenaConfig(preset("qwen3.5-4b"), capacity=100 * GiB)
    s = SplitPools(cfg)
    for name, (lo, hi) in split_regions(cfg).items():
        b = s.bands[name]
        assert (b.lo_byte, b.hi_byte) == (lo, hi)
    check_all(s)


# =============================================================================================
# Refusals


def _rows() -> tuple[Row, ...]:
    return mha_rows([0], kv_heads=1, head_dim=8)


@pytest.mark.parametrize(("classes", "words"), [
    ((StateClass("full", Kind.FULL, _rows()),), "plain paged pool"),
    ((StateClass("state", Kind.RECURRENT, _rows()),), "plain paged pool"),
    ((StateClass("w", Kind.WINDOW, _rows(), window=4), StateClass("s", Kind.RECURRENT, _rows())),
     "no full-attention class"),
    ((StateClass("f", Kind.FULL, _rows()), StateClass("g", Kind.FULL, _rows())), "merge their rows"),
    ((StateClass("f", Kind.FULL, _rows()), StateClass("s", Kind.RECURRENT, _rows()),
      StateClass("t", Kind.RECURRENT, _rows())), "merge their rows"),
    ((StateClass("f", Kind.FULL, _rows()), StateClass("f", Kind.RECURRENT, _rows())), "must be unique"),
    ((), "no layers only"),
])
def test_validate_model_refuses(classes: tuple[StateClass, ...], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as exc:
        validate_model(ModelSpec("m", classes, max_context_len=16))
    assert type(exc.value) is ConfigError


def test_misaligned_row_refused_at_class_construction() -> None:
    with pytest.raises(MisalignedRowError, match="not a multiple of 16 B"):
        StateClass("full", Kind.FULL, mha_rows([0], kv_heads=1, head_dim=7))  # 14-B rows
    StateClass("full", Kind.FULL, mha_rows([0], kv_heads=1, head_dim=24))  # 48 B: fine


def test_unknown_preset_lists_choices() -> None:
    with pytest.raises(ConfigError, match="choose one of") as exc:
        preset("gpt-5")
    assert all(n in str(exc.value) for n in PRESETS)


def test_config_context_len_override() -> None:
    m = preset("toy-tri")
    assert ArenaConfig(m, capacity=4096).context_len == m.max_context_len == 32
    assert ArenaConfig(m, capacity=4096, max_context_len=16).context_len == 16


def test_summarize() -> None:
    s = summarize(ArenaConfig(preset("toy-tri"), capacity=4096, page_size=4))
    assert s.name == "toy-tri"
    assert s.per_class == {"full": ("full", 64, 256), "window": ("window", 128, 512),
                           "state": ("recurrent", 64, 64)}


# =============================================================================================
# Scale: an H200-size GPT-OSS-20B arena


def test_scale_gpt_oss_20b_h200() -> None:
    """130 GiB, page_size 64: ~88k pages per class; 5,000 admit / extend / free with a deterministic mix."""
    a = Arena(ArenaConfig(preset("gpt-oss-20b"), capacity=130 * GiB, page_size=64))
    assert {n: b.top for n, b in a.bands.items()} == {"window": 88746, "full": 88746}
    rng = random.Random(2024)
    live: list[str] = []
    ops = {"admit": 0, "extend": 0, "free": 0, "rejected": 0}
    for step in range(5000):
        r = rng.random()
        if r < 0.4 or not live:
            ops["admit"] += 1
            try:
                a.admit(f"q{step}", {"full": rng.randint(1, 256), "window": 3})
                live.append(f"q{step}")
            except AdmissionRejectedError as e:
                assert e.shortfall_bytes > 0
                ops["rejected"] += 1
                a.free(live.pop(0))  # evict the oldest request
        elif r < 0.85:
            ops["extend"] += 1
            o = rng.choice(live)
            try:
                a.extend(o, {"full": rng.randint(1, 8), "window": 1})
                a.slide(o, "window", 1)  # the window keeps a bounded suffix
            except AdmissionRejectedError:
                ops["rejected"] += 1
        else:
            ops["free"] += 1
            a.free(live.pop(rng.randrange(len(live))))
    assert ops["admit"] + ops["extend"] + ops["free"] == 5000
    assert ops["rejected"] > 0 and a.stats.rung_used[2] > 0  # the run reached memory pressure
    assert all(len(a.held(o)["window"]) <= 3 for o in live)
    assert a.used_bytes() <= a.capacity
    check_all(a)


# =============================================================================================
# Hymba-1.5B: the one preset with three classes (state | window float | full), so rung 3 runs on a real model

HYMBA_GLOBAL = [0, 15, 31]  # global_attn_idx
HYMBA_KV_PRODUCERS = [1, 3, 5, 7, 9, 11, 13, 16, 19, 21, 23, 25, 27, 29]  # first layer of each kv_reuse_group


def test_hymba_bytes_by_hand_from_the_config() -> None:
    """K and V: 5 KV heads x head_dim 64 (1600 / 25) x 2 B = 640 B each; Mamba: d_inner 3200 (expand 2 x 1600),
    conv 3200 x (d_conv 4 - 1) bf16 = 19,200 B, ssm 3200 x d_state 16 fp32 = 204,800 B, in every one of 32 layers."""
    cfg = ArenaConfig(preset("hymba-1.5b"), capacity=GiB, page_size=64)
    kv_layer = 2 * 5 * 64 * 2
    mamba_layer = 3200 * 3 * 2 + 3200 * 16 * 4
    assert (kv_layer, mamba_layer) == (1280, 224000)
    assert summarize(cfg).per_class == {
        "full": ("full", 3 * kv_layer, 64 * 3 * kv_layer),  # 3,840 B / token, 245,760 B / page
        "window": ("window", 14 * kv_layer, 64 * 14 * kv_layer),  # 17,920 B / token, 1,146,880 B / page
        "state": ("recurrent", 32 * mamba_layer, 32 * mamba_layer),  # 7,168,000 B per request
    }
    assert cfg.model.bytes_per_token(Kind.FULL) + cfg.model.bytes_per_token(Kind.WINDOW) == 17 * kv_layer


def test_hymba_rows_follow_global_layers_and_kv_sharing() -> None:
    """Consumer layers of a kv_reuse_group read their producer's K/V: no rows of their own. Every layer has a
    Mamba head beside its attention heads, so every layer has state rows."""
    m = preset("hymba-1.5b")
    layers = {c.name: sorted({r.layer for r in c.rows}) for c in m.classes}
    assert layers == {"full": HYMBA_GLOBAL, "window": HYMBA_KV_PRODUCERS, "state": list(range(32))}
    consumers = set(range(32)) - set(HYMBA_GLOBAL) - set(HYMBA_KV_PRODUCERS)
    assert len(consumers) == 15 and consumers == {2, 4, 6, 8, 10, 12, 14, 17, 18, 20, 22, 24, 26, 28, 30}
    assert m.cls("window").window == 1024 + 128  # sliding_window + the meta tokens every SWA layer keeps
    assert any("meta tokens" in a for a in m.assumptions) and any("kv_reuse_group" in a for a in m.assumptions)
    assert worst_case_demand(ArenaConfig(m, capacity=GiB)) == {"full": 128, "window": 19, "state": 1}


def test_hymba_three_classes_in_chain_order_at_an_h200_budget() -> None:
    from kvarena.simulator.budget import replay_budget

    cap, line = replay_budget("hymba-1.5b")
    assert "3.04 GB weights" in line and 118 * GiB < cap < 119 * GiB
    a = Arena(ArenaConfig(preset("hymba-1.5b"), capacity=cap, page_size=64))
    assert [c.name for c in chain(a.config.model)] == ["state", "window", "full"]
    assert [a.bands[n].role.value for n in a.order] == ["low", "float", "high"]
    assert a.bands["full"].top == cap // 245760 and a.bands["state"].top == cap // 7168000
    a.admit("r", {"state": 1, "window": 19, "full": 128})
    check_all(a)


def test_hymba_rung3_moves_the_window_float_and_content_follows() -> None:
    """256 MiB: the window float's split-pool hint is slot 107 (122,716,160 B), so 17 state slots fit below it;
    the 18th admission needs the float moved up (rung 3), and a stand-alone relayout opens room the same way."""
    from kvarena.spec.types import Rung

    a = Arena(ArenaConfig(preset("hymba-1.5b"), capacity=256 << 20, page_size=64))
    w = a.admit("W", {"window": 19}).pages["window"]
    assert [a.translate(v)[1] for v in w] == list(range(107, 126))
    a.write(w[0], 3, 1, 41)
    a.admit("F", {"full": 128})
    for i in range(17):
        assert a.admit(f"S{i}", {"state": 1}).plan.rung is Rung.REUSE
    ad = a.admit("S17", {"state": 1})
    assert ad.plan.rung is Rung.RELAYOUT and ad.plan.moves
    assert {m.cls for m in ad.plan.moves} == {"window"}
    assert ad.plan.bytes_moved == {3: len(ad.plan.moves) * 1146880}
    assert a.read(w[0], 3, 1) == 41 and a.translate(w[0])[1] > 107
    check_all(a)
    # free a state request and the window's owner, re-admit a window, fill state to the float: relayout alone
    a.free("S0")
    a.free("W")
    w2 = a.admit("W2", {"window": 19}).pages["window"]
    a.write(w2[-1], 0, 0, 7)
    while a.plan_admission({"state": 1}).rung is Rung.REUSE:
        a.admit(f"T{a.stats.admitted}", {"state": 1})
    plan = a.relayout({"state": 1})
    assert plan.rung is Rung.RELAYOUT and {m.cls for m in plan.moves} == {"window"} and not plan.placements
    assert a.read(w2[-1], 0, 0) == 7
    assert a.admit("after", {"state": 1}).plan.rung is Rung.REUSE  # the room below the float is open now
    assert a.stats.rung_used[3] >= 1
    check_all(a)


def test_hymba_feasibility_floor_is_what_the_refusal_says() -> None:
    """Three bands: the float's grid need not meet its neighbours', so the floor is not exact; the capacity the
    refusal names (worst-case bytes + the largest page) holds the worst-case request."""
    probe = ArenaConfig(preset("hymba-1.5b"), capacity=GiB)
    worst = worst_case_demand(probe)
    need = sum(n * probe.page_bytes(c) for c, n in worst.items())
    assert need == 128 * 245760 + 19 * 1146880 + 7168000
    with pytest.raises(CapacityTooSmallError, match=f"at least {need + 7168000} B"):
        Arena(ArenaConfig(probe.model, capacity=need + 40960))
    a = Arena(ArenaConfig(probe.model, capacity=need + 7168000))
    a.admit("worst", worst)
    check_all(a)
