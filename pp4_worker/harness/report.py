"""Terminal table, JSON and PNG plot of a worker run."""
from __future__ import annotations

import json

RATIO_TARGET = 1.3
EXCLUSIONS = ("Outside the timing: collectives between two GPUs (here the all-reduce is an on-GPU add of the "
              "two ranks' partials, inside the timing), transport of inputs/proposals between target and "
              "draft, and target verification.")


def timing_table(timings: list, unit_note: str) -> str:
    head = (f"{'cell':<18} {'median ms':>10} {'p20 ms':>9} {'p80 ms':>9} {'IQR/med':>8} "
            f"{'floor ms':>9} {'ratio':>6} {'+KV ratio':>9}")
    lines = [head, "-" * len(head)]
    for t in timings:
        floor = f"{t.floor_ms:9.3f}" if t.floor_ms else f"{'-':>9}"
        ratio = f"{t.ratio:6.2f}" if t.ratio else f"{'-':>6}"
        kv = f"{t.median_ms / t.floor_with_kv_ms:9.2f}" if t.floor_with_kv_ms else f"{'-':>9}"
        lines.append(f"{t.cell:<18} {t.median_ms:10.3f} {t.p20_ms:9.3f} {t.p80_ms:9.3f} "
                     f"{100 * t.iqr_over_median:7.1f}% {floor} {ratio} {kv}")
    lines.append(unit_note)
    return "\n".join(lines)


def markdown_table(timings: list) -> str:
    lines = ["| cell | median ms | p20 ms | p80 ms | IQR/median | weight-read floor ms | ratio |",
             "|---|---|---|---|---|---|---|"]
    for t in timings:
        lines.append(f"| {t.cell} | {t.median_ms:.3f} | {t.p20_ms:.3f} | {t.p80_ms:.3f} | "
                     f"{100 * t.iqr_over_median:.1f}% | {t.floor_ms:.3f} | {t.ratio:.2f} |"
                     if t.floor_ms else f"| {t.cell} | {t.median_ms:.3f} | {t.p20_ms:.3f} | {t.p80_ms:.3f} | "
                     f"{100 * t.iqr_over_median:.1f}% | - | - |")
    return "\n".join(lines)


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True, default=str)
        f.write("\n")


def write_plot(path: str, timings: list, title: str) -> str:
    """PNG: per-cell median with p20-p80 bars, and the ratio to the weight-read floor.

    Returns a one-line note of what happened (matplotlib may be missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"plot skipped: matplotlib is not importable (wanted {path})"
    names = [t.cell for t in timings]
    x = list(range(len(names)))
    med = [t.median_ms for t in timings]
    lo = [t.median_ms - t.p20_ms for t in timings]
    hi = [t.p80_ms - t.median_ms for t in timings]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.45 * len(names) + 2), 7), sharex=True)
    colors = {"greedy": "tab:blue", "sampled": "tab:orange", "switch": "tab:green"}
    cols = [colors.get(n.rsplit("-", 1)[-1], "tab:gray") for n in names]
    ax1.bar(x, med, color=cols, yerr=[lo, hi], capsize=2)
    floors = [t.floor_ms for t in timings]
    if all(floors):
        ax1.scatter(x, floors, marker="_", s=200, color="black", label="weight-read floor", zorder=3)
        ax1.legend(loc="upper left")
    ax1.set_ylabel("call time, ms (median, p20-p80)")
    ax1.set_title(title)
    ratios = [t.ratio or 0 for t in timings]
    ax2.bar(x, ratios, color=cols)
    ax2.axhline(RATIO_TARGET, color="red", linestyle="--", label=f"target {RATIO_TARGET}")
    ax2.set_ylabel("call / weight-read floor")
    ax2.legend(loc="upper left")
    ax2.set_xticks(x)
    ax2.set_xticklabels(names, rotation=70, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"
