#!/usr/bin/env python3
"""Plots a `dsmla bench --calibrate` file: per head count, the measured
dense / sparse time ratio of every chunk against its sequence length (one
colour per cached context), with the route the calibrated factor chooses
(o dense, x sparse, as the file records it). Points below 1 are faster dense; a choice on the wrong
side of 1 is a misrouted chunk.

    python3 bench/plot_calibration.py cost_factors.json calibration.png
"""
import json
import sys

def main(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.load(open(path))
    grids = doc["calibration"]
    fig, axes = plt.subplots(1, len(grids), figsize=(6 * len(grids), 4.5), squeeze=False)
    for ax, g in zip(axes[0], grids):
        f = g["dense_cost_factor"]
        contexts = sorted({p["ctx_len"] for p in g["grid"]})
        cmap = plt.get_cmap("viridis", len(contexts))
        for i, ctx in enumerate(contexts):
            pts = sorted((p for p in g["grid"] if p["ctx_len"] == ctx), key=lambda p: p["q_len"])
            xs = [ctx + p["q_len"] for p in pts]
            ys = [p["dense_ms"] / p["sparse_ms"] for p in pts]
            ax.plot(xs, ys, color=cmap(i), lw=1, label=f"ctx {ctx}")
            for x, y, p in zip(xs, ys, pts):
                ax.scatter([x], [y], color=cmap(i), marker="o" if p["routed_dense"] else "x", s=28)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (cached + new tokens)")
        ax.set_ylabel("dense time / sparse time")
        ax.set_title(f"H {g['num_heads']}: factor {f:.3g}, faster path at "
                     f"{g['faster_chosen']}/{g['points']}, worst {g['worst_slowdown']:.2f}x")
        ax.legend(fontsize=7)
    fig.suptitle(f"{doc.get('device', '')} {doc.get('date', '')}  (o: routed dense, x: routed sparse)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
