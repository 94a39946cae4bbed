"""PNG plots of ``kvarena simulate`` (matplotlib, Agg backend, imported inside :func:`write_all` only).

Per workload:
  <name>-frontiers.png   the unified arena's band spans over modeled time (each band's bytes, the
                         free gap between them) beside the split pools' fixed region boundaries,
                         and the gap's size over time
  <name>-occupancy.png   bytes of live pages per state class over time, one panel per configuration
  <name>-active.png      requests running at once over time, one line per configuration
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GiB = float(1 << 30)
COLORS = {"full": "#1f77b4", "window": "#ff7f0e", "state": "#2ca02c"}
KIND_STYLE = {"split": ("#d62728", "-"), "unified": ("#1f77b4", "-"), "vllm": ("#2ca02c", "--")}


def _color(cls: str, i: int) -> str:
    return COLORS.get(cls, f"C{i + 3}")


def require() -> None:
    """Import matplotlib now: a missing extra fails before any simulation runs."""
    _pyplot()


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _main(rep) -> list:
    return [o for o in rep.main() if o.series.get("t")]


def plot_active(rep, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, o in enumerate(_main(rep)):
        color, ls = KIND_STYLE.get(o.kind, (f"C{i}", "-"))
        if o.kind != "vllm" and o.swa_ratio != rep.outcomes[0].swa_ratio:
            ls = ":"
        s = o.series
        ax.step(s["t"], s["active"], where="post", color=color, ls=ls, lw=1.3,
                label=f"{o.config} (max {o.max_active:,}, mean {o.mean_active:,.0f})")
    ax.set_xlabel("modeled time (s)")
    ax.set_ylabel("requests running")
    ax.set_title(f"{rep.workload.name}: active requests over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_occupancy(rep, path: Path) -> Path:
    plt = _pyplot()
    outs = _main(rep)
    fig, axes = plt.subplots(len(outs), 1, figsize=(9, 2.4 * len(outs) + 0.6), sharex=True, squeeze=False)
    for ax, o in zip(axes[:, 0], outs):
        s = o.series
        classes = list(s["occupancy"][0])
        ys = [[occ[c] / GiB for occ in s["occupancy"]] for c in classes]
        ax.stackplot(s["t"], ys, labels=classes, colors=[_color(c, i) for i, c in enumerate(classes)], alpha=0.8)
        ax.axhline(rep.capacity / GiB, color="k", lw=0.8, ls="--", label="capacity")
        if o.kind == "split":
            for c, (lo, hi) in rep.regions.items():
                if c != classes[-1]:
                    ax.axhline((hi - lo) / GiB, color=_color(c, 0), lw=0.8, ls=":", label=f"{c} pool size")
        ax.set_ylabel("GiB live")
        ax.set_title(f"{o.config}: bytes of live pages per class", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("modeled time (s)")
    fig.suptitle(f"{rep.workload.name}: per-band occupancy", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_frontiers(rep, path: Path) -> Path | None:
    plt = _pyplot()
    uni = next((o for o in _main(rep) if o.kind == "unified" and o.series.get("spans")), None)
    if uni is None:
        return None
    s = uni.series
    fig, (ax, gx) = plt.subplots(2, 1, figsize=(9, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 1.2]})
    bands = list(s["spans"][0])
    for i, b in enumerate(bands):
        lo = [sp[b][0] / GiB for sp in s["spans"]]
        hi = [sp[b][1] / GiB for sp in s["spans"]]
        ax.fill_between(s["t"], lo, hi, step="post", color=_color(b, i), alpha=0.55, label=f"{b} band (unified)")
        ax.step(s["t"], lo, where="post", color=_color(b, i), lw=0.8)
        ax.step(s["t"], hi, where="post", color=_color(b, i), lw=0.8)
    names = list(rep.regions)
    for below, above in zip(names, names[1:]):  # the fixed walls between the split pools' regions
        ax.axhline(rep.regions[above][0] / GiB, color="k", ls="--", lw=1.0,
                   label=f"split pools: {below} | {above} wall")
    ax.set_ylim(0, rep.capacity / GiB)
    ax.set_ylabel("arena offset (GiB)")
    ax.set_title(f"{rep.workload.name}: unified arena band frontiers (white: the free gap)")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    gx.step(s["t"], [g / GiB for g in s["gap"]], where="post", color="k", lw=1.0)
    gx.set_ylabel("gap (GiB)")
    gx.set_xlabel("modeled time (s)")
    gx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_matrix(mats, path: Path) -> Path:
    """One panel per workload: each allocator's metric under each rule set (simulator/matrix.py), as a share of
    the arena's under SGLang's rules, so rows with different units sit side by side."""
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(mats)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 0.8), squeeze=False)
    for ax, m in zip(axes.flat, mats):
        base = m.get("kvarena arena", "sglang") or 0.0
        width = 0.8 / max(1, len(m.allocators))
        for i, a in enumerate(m.allocators):
            ys = [(m.get(a, s) or 0.0) / base if base else 0.0 for s in m.rule_sets]
            ax.bar([j + i * width for j in range(len(m.rule_sets))], ys, width, label=a, color=_color(a, i))
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(m.rule_sets))])
        ax.set_xticklabels(m.rule_sets, fontsize=7)
        lower = " (lower is better)" if m.metric in ("retractions_per_1k", "ttft_p50") else ""
        ax.set_title(f"{m.workload.name}\n{m.metric}{lower}, / arena@sglang", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle("allocators x rule sets, the same bytes and requests", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(rep, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = rep.workload.name
    paths = [plot_frontiers(rep, out_dir / f"{name}-frontiers.png"),
             plot_occupancy(rep, out_dir / f"{name}-occupancy.png"),
             plot_active(rep, out_dir / f"{name}-active.png")]
    return [p for p in paths if p is not None]
