"""Make the figures the notebooks show: cluster topology and rank-layout diagrams.

    .venv/bin/python images/make_figures.py          # writes images/*.png

The rank layouts come from labkit's rank grid (megatron-core's ``tp-cp-ep-dp-pp`` order), so a
figure never disagrees with what the planner prints or what the engine builds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from labkit.planner.grid import rank_grid  # noqa: E402

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948",
          "#ff9da7"]


def _node_box(ax: plt.Axes, x: float, y: float, w: float, h: float, label: str) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc="#f4f4f4",
                                ec="#333333", lw=1.5))
    ax.text(x + w / 2, y + h + 0.08, label, ha="center", va="bottom", fontsize=11,
            weight="bold")


def topology(nodes: int = 2, gpus_per_node: int = 2) -> plt.Figure:
    """Nodes, their GPUs (processes on CPU), the fast intra-node link and the network."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    w, gap = 3.0, 1.2
    for n in range(nodes):
        x0 = n * (w + gap)
        _node_box(ax, x0, 1.0, w, 1.8, f"node {n}")
        xs = [x0 + (i + 0.5) * w / gpus_per_node for i in range(gpus_per_node)]
        for i, x in enumerate(xs):
            rank = n * gpus_per_node + i
            ax.add_patch(FancyBboxPatch((x - 0.45, 1.9), 0.9, 0.6, boxstyle="round,pad=0.02",
                                        fc=COLORS[0], ec="none"))
            ax.text(x, 2.2, f"GPU {i}\nrank {rank}", ha="center", va="center", color="white",
                    fontsize=9)
        ax.plot([xs[0], xs[-1]], [1.6, 1.6], color=COLORS[2], lw=5, solid_capstyle="round")
        ax.text(x0 + w / 2, 1.3, "NVLink / shared memory\n(CPU: loopback)", ha="center",
                va="center", fontsize=8)
        ax.plot([x0 + w / 2, x0 + w / 2], [1.0, 0.45], color=COLORS[3], lw=2.5)
    total = nodes * w + (nodes - 1) * gap
    ax.plot([w / 2, total - w / 2], [0.45, 0.45], color=COLORS[3], lw=2.5)
    ax.text(total / 2, 0.15, "network between nodes: InfiniBand / Ethernet "
            "(mini-cluster: bridge shaped with tc tbf)", ha="center", fontsize=9)
    ax.set_xlim(-0.4, total + 0.4)
    ax.set_ylim(0, 3.2)
    ax.axis("off")
    ax.set_title(f"{nodes} nodes x {gpus_per_node} GPUs = world size {nodes * gpus_per_node}")
    return fig


def rank_layout(tp: int, pp: int, nodes: int = 2, gpus_per_node: int = 2) -> plt.Figure:
    """Every rank in its node, coloured by pipeline stage, with its TP and DP coordinates."""
    grid = rank_grid(nodes * gpus_per_node, tp, pp, gpus_per_node)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    w, gap = 3.0, 1.2
    for n in range(nodes):
        x0 = n * (w + gap)
        _node_box(ax, x0, 0.6, w, 1.6, f"node {n}")
        for i in range(gpus_per_node):
            r = n * gpus_per_node + i
            c = grid.coords(r)
            x = x0 + (i + 0.5) * w / gpus_per_node
            ax.add_patch(FancyBboxPatch((x - 0.55, 0.9), 1.1, 1.0, boxstyle="round,pad=0.02",
                                        fc=COLORS[c["pp"] % len(COLORS)], ec="none"))
            ax.text(x, 1.4, f"rank {r}\nTP {c['tp']}  DP {c['dp']}\nstage {c['pp']}",
                    ha="center", va="center", color="white", fontsize=9)
    cross = grid.groups_crossing_nodes()
    note = "; ".join(f"{a.upper()} groups {gs} cross nodes" for a, gs in cross.items()
                     if gs and a != "cp") or "no group crosses a node"
    ax.text((nodes * w + (nodes - 1) * gap) / 2, 0.25, note, ha="center", fontsize=9)
    ax.set_xlim(-0.4, nodes * w + (nodes - 1) * gap + 0.4)
    ax.set_ylim(0, 2.7)
    ax.axis("off")
    ax.set_title(f"TP={tp} x PP={pp} x DP={grid.dp} on {nodes} x {gpus_per_node} "
                 f"(colour = pipeline stage)")
    return fig


FIGURES = {
    "topology_2x2.png": lambda: topology(2, 2),
    "layout_tp2_pp2.png": lambda: rank_layout(2, 2),
    "layout_tp2_dp2.png": lambda: rank_layout(2, 1),
    "layout_pp2_dp2.png": lambda: rank_layout(1, 2),
    "layout_dp4.png": lambda: rank_layout(1, 1),
}


def main(out_dir: Path = HERE) -> list[Path]:
    written = []
    for name, make in FIGURES.items():
        fig = make()
        path = out_dir / name
        # a fixed dpi and no metadata keep the PNGs byte-stable between runs
        fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in main():
        print(p.relative_to(HERE.parent))
