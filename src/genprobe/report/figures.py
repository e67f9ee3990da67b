"""PNG figures of the case study (the chapter's Fig. 3.1, 3.4, 3.5 and the perturbation shadow), via matplotlib (Agg).
Labels are ASCII: CJK fonts may be absent on a CI machine; the HTML report shows the Chinese texts beside them."""

from __future__ import annotations

from typing import Any

from ..loops.pages import figure_png

GREEN, RED, TEAL, ORANGE, GREY = "#2e7d32", "#c62828", "#00838f", "#ef6c00", "#9e9e9e"


def decoding_bars(ax: Any, case: dict) -> None:
    """Fig. 3.1: distinct-2 per decoding strategy (red = deterministic, green = sampled), ours beside the chapter's."""
    rows = case["decoding"]["rows"]
    seed = {r["strategy"]: r for r in case.get("seed", {}).get("decoding", {}).get("rows", [])}
    names = [r["strategy"] for r in rows]
    y = range(len(rows))
    colors = [RED if r["sampler"]["greedy"] else GREEN for r in rows]
    ax.barh([i + 0.2 for i in y], [r["distinct_2"] for r in rows], height=0.4, color=colors, label="ours")
    if seed:
        seeded = [seed.get(n, {}).get("distinct_2", 0) for n in names]
        ax.barh([i - 0.2 for i in y], seeded, height=0.4, color=GREY, alpha=0.6, label="seed")
    for i, r in enumerate(rows):
        rep = r.get("longest_repeat")
        ax.text(r["distinct_2"] + 0.01, i + 0.2, f"{rep}-gram" if rep and rep >= 2 else "none", va="center", fontsize=7)
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.axvline(0.9, color="k", lw=0.6, ls=":")
    ax.set_xlabel("distinct-2 (higher = less repetitive); label: longest n-gram seen >= 3 times")
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    ax.set_title("Decoding strategies on the case prompt (50 new tokens)")


def entropy_vs_temperature(ax: Any, case: dict) -> None:
    """Fig. 3.5: entropy (left axis) and max probability (right axis) against τ."""
    s = case["sampling"]
    rows = s["entropy_vs_temperature"]
    taus = [r["tau"] for r in rows]
    ax.plot(taus, [r["entropy"] for r in rows], "o-", color=TEAL, label="entropy (nats)")
    ax.axhline(s["log_vocab"], color=TEAL, ls=":", lw=0.8)
    ax.text(taus[-1], s["log_vocab"], f"ln V = {s['log_vocab']:.2f}", va="bottom", ha="right", fontsize=7, color=TEAL)
    seed = case.get("seed", {}).get("sampling", {}).get("entropy_vs_temperature") or []
    seed_taus = [r["tau"] for r in seed]
    if seed:
        ax.plot(seed_taus, [r["entropy"] for r in seed], "x--", color=TEAL, alpha=0.45, label="seed entropy")
    ax.set_xlabel("temperature tau")
    ax.set_ylabel("entropy (nats)", color=TEAL)
    ax2 = ax.twinx()
    ax2.plot(taus, [r["max_prob"] for r in rows], "s-", color=ORANGE, label="max prob")
    if seed:
        ax2.plot(seed_taus, [r["max_prob"] for r in seed], "x--", color=ORANGE, alpha=0.45, label="seed max prob")
    ax2.set_ylabel("max probability", color=ORANGE)
    ax2.set_ylim(0, 1.05)
    ax2.spines["right"].set_visible(True)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, frameon=False, loc="center right")
    ax.set_title("Temperature reshapes the real next-token distribution")


def _timing_rows(case: dict) -> list[tuple[str, dict]]:
    """(label, row) of the small model's batch sizes, then the 8-layer model's lengths."""
    small, scaled = (case.get(k, {}).get("rows", []) for k in ("cache_timing", "cache_scaling"))
    return [(f"small, batch {r['batch']}", r) for r in small] + [(f"8-layer, {r['new_tokens']} new", r) for r in scaled]


def compute_vs_speedup(ax: Any, case: dict) -> None:
    """Fig. 3.4: compute saved by the KV cache (counted token forwards) vs measured wall-clock speed-up."""
    labels, rows = zip(*_timing_rows(case), strict=True)
    compute, speed = [r["compute_ratio"] for r in rows], [r["speedup"] for r in rows]
    y = range(len(labels))
    ax.barh([i - 0.2 for i in y], compute, height=0.4, color=GREY, label="compute saved (x)")
    ax.barh([i + 0.2 for i in y], speed, height=0.4, color=TEAL, label="wall-clock speed-up (x)")
    for i in y:
        ax.text(compute[i], i - 0.2, f" {compute[i]:.1f}x", va="center", fontsize=7)
        ax.text(speed[i], i + 0.2, f" {speed[i]:.2f}x", va="center", fontsize=7)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1, color="k", lw=0.6)
    ax.set_xlabel("ratio naive / cached (log scale), CPU")
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    ax.set_title("KV cache: arithmetic saved vs time saved")


def perturbation_curves(ax: Any, case: dict) -> None:
    """Δloss per step after one wrong token, for each perturbed position k (the chapter's k = 8 curve dashed)."""
    # one colour per curve: fewer curves (PERTURB_POSITIONS, 4) than colours, so the colours are cut short
    for p, c in zip(case["exposure"]["perturbation"], (TEAL, ORANGE, RED, GREEN, GREY), strict=False):
        xs = list(range(1, len(p["curve"]) + 1))
        ax.plot(xs, p["curve"], "o-", ms=3, color=c, label=f"k = {p['k']}")
    seed = case.get("seed", {}).get("exposure", {}).get("perturbation_curve_k8")
    if seed:
        ax.plot(range(1, len(seed) + 1), seed, "x--", color="k", alpha=0.35, label="seed k = 8")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("steps after the wrong token")
    ax.set_ylabel("delta loss (nats)")
    ax.legend(fontsize=7, frameon=False, ncol=2)
    ax.set_title("The shadow of one wrong token (real text fed afterwards)")


FIGURES = {  # name: (draw(ax, case), the case key it needs, size in inches)
    "fig_decoding_distinct2.png": (decoding_bars, "decoding", lambda case: (6.4, 3.2)),
    "fig_entropy_temperature.png": (entropy_vs_temperature, "sampling", lambda case: (6.0, 3.0)),
    "fig_cache_compute_vs_speed.png": (
        compute_vs_speedup,
        "cache_timing",
        lambda case: (6.4, 0.45 * len(_timing_rows(case)) + 1.0),
    ),
    "fig_perturbation_shadow.png": (perturbation_curves, "exposure", lambda case: (6.0, 3.0)),
}


def render_figures(case: dict, seed: dict) -> dict[str, bytes]:
    """Name → PNG bytes for every figure whose data is present in ``case`` (``seed``'s figures drawn beside)."""
    import matplotlib

    full = {**case, "seed": seed}
    style = {"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "savefig.bbox": "tight"}
    with matplotlib.rc_context(style):  # type: ignore[arg-type]  # its stubs want each key spelled as a Literal
        return {
            name: figure_png([draw], full, size(case), 110)
            for name, (draw, needs, size) in FIGURES.items()
            if needs in case
        }
