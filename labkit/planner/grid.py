"""The rank grid: which global rank holds which (TP, CP, DP, PP) coordinate, on which node.

megatron-core's ``initialize_model_parallel`` lays ranks out in the order ``tp-cp-ep-dp-pp``
(its default ``order``): TP varies fastest, then CP, then EP (1 here), then DP, and PP slowest::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so with 16 GPUs, TP=2, PP=4 (the example in megatron-core's ``parallel_state`` docstring) the
TP groups are [0, 1], [2, 3], ...; the DP groups [0, 2], [1, 3], [4, 6], ...; the PP groups
[0, 4, 8, 12], [1, 5, 9, 13], ... A TP group therefore sits on consecutive ranks, which a
launcher places on one node: that is why TP should not exceed the GPUs per node.

Pure arithmetic (no torch): the tests compare it with the groups megatron-core really builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from labkit.errors import ConfigError

if TYPE_CHECKING:  # pandas is imported only by to_frame()
    import pandas as pd

ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class RankGrid:
    """Ranks of one (TP, CP, DP, PP) layout; groups are sorted by their first rank."""

    world_size: int
    tp: int
    pp: int
    dp: int
    cp: int
    gpus_per_node: int

    # --- coordinates ---------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """``{"tp": .., "cp": .., "dp": .., "pp": ..}`` of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        tp_rank = rank % self.tp
        cp_rank = (rank // self.tp) % self.cp
        dp_rank = (rank // (self.tp * self.cp)) % self.dp
        pp_rank = rank // (self.tp * self.cp * self.dp)
        return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The global rank at a coordinate (the inverse of ``coords``)."""
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def node_of(self, rank: int) -> int:
        """Node index of a rank: launchers fill node 0 with ranks 0..gpus_per_node-1, and so on."""
        return rank // self.gpus_per_node

    # --- groups ----------------------------------------------------------------------------------
    def _groups(self, axis: str) -> list[list[int]]:
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        others = [a for a in sizes if a != axis]
        groups = []
        for r in range(self.world_size):
            c = self.coords(r)
            if c[axis] == 0:  # r is the first rank of its group along `axis`
                base = {a: c[a] for a in others}
                groups.append([self.rank(**base, **{axis: i}) for i in range(sizes[axis])])
        return sorted(groups)

    @property
    def tp_groups(self) -> list[list[int]]:
        return self._groups("tp")

    @property
    def cp_groups(self) -> list[list[int]]:
        return self._groups("cp")

    @property
    def dp_groups(self) -> list[list[int]]:
        """Data-parallel groups without CP (megatron's ``get_data_parallel_group()``)."""
        return self._groups("dp")

    @property
    def pp_groups(self) -> list[list[int]]:
        return self._groups("pp")

    def groups(self) -> dict[str, list[list[int]]]:
        return {"tp": self.tp_groups, "cp": self.cp_groups, "dp": self.dp_groups,
                "pp": self.pp_groups}

    def crosses_nodes(self, axis: str) -> bool:
        """Whether any group along ``axis`` spans two nodes (fast: no group lists are built)."""
        stride = {"tp": 1, "cp": self.tp, "dp": self.tp * self.cp,
                  "pp": self.tp * self.cp * self.dp}[axis]
        size = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}[axis]
        if size == 1:
            return False
        # Ranks of a group increase, so it stays on one node iff its first and last rank do.
        span = (size - 1) * stride
        if span >= self.gpus_per_node:
            return True
        if self.gpus_per_node % (stride * size) == 0:  # aligned blocks inside one node
            return False
        return any(self.node_of(block + off) != self.node_of(block + off + span)
                   for block in range(0, self.world_size, stride * size)
                   for off in range(stride))

    def groups_crossing_nodes(self) -> dict[str, list[list[int]]]:
        """Per axis, the groups whose ranks sit on more than one node (their traffic leaves it)."""
        out: dict[str, list[list[int]]] = {}
        for axis, groups in self.groups().items():
            out[axis] = [g for g in groups if len({self.node_of(r) for r in g}) > 1]
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per rank: node, local rank, coordinates and group index per axis."""
        # pandas: only to_frame() needs it
        import pandas as pd

        index = {axis: {r: i for i, g in enumerate(gs) for r in g}
                 for axis, gs in self.groups().items()}
        rows = []
        for r in range(self.world_size):
            c = self.coords(r)
            rows.append({"rank": r, "node": self.node_of(r), "local_rank": r % self.gpus_per_node,
                         "tp_rank": c["tp"], "cp_rank": c["cp"], "dp_rank": c["dp"],
                         "pp_rank": c["pp"], "tp_group": index["tp"][r],
                         "dp_group": index["dp"][r], "pp_group": index["pp"][r]})
        return pd.DataFrame(rows)

    def render(self) -> str:
        """A text picture: one line per node, each rank as ``r<rank>(t<tp> d<dp> p<pp>)``."""
        lines = [f"world {self.world_size} = TP {self.tp} x CP {self.cp} x DP {self.dp} x "
                 f"PP {self.pp}  (order {ORDER}, TP fastest)"]
        nodes = -(-self.world_size // self.gpus_per_node)
        for n in range(nodes):
            ranks = range(n * self.gpus_per_node, min((n + 1) * self.gpus_per_node, self.world_size))
            cells = []
            for r in ranks:
                c = self.coords(r)
                cells.append(f"r{r}(t{c['tp']} d{c['dp']} p{c['pp']})")
            lines.append(f"node {n}: " + " ".join(cells))
        return "\n".join(lines)


def rank_grid(world_size: int, tp: int, pp: int, gpus_per_node: int, cp: int = 1) -> RankGrid:
    """The rank grid of a layout in megatron-core's ``tp-cp-ep-dp-pp`` order.

    Args:
        world_size: total ranks (nodes x gpus_per_node).
        tp, pp, cp: tensor-, pipeline- and context-parallel sizes; DP is what is left.
        gpus_per_node: ranks per node (processes per node on CPU), for ``node_of``.

    Raises:
        ConfigError: when the sizes are not positive or TP x CP x PP does not divide world_size.
    """
    for name, v in (("world_size", world_size), ("tp", tp), ("pp", pp), ("cp", cp),
                    ("gpus_per_node", gpus_per_node)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"rank_grid: {name}={v!r} must be a positive integer")
    model = tp * cp * pp
    if world_size % model:
        raise ConfigError(f"rank_grid: TP x CP x PP = {tp} x {cp} x {pp} = {model} does not divide "
                          f"world_size {world_size}; choose sizes whose product divides it")
    return RankGrid(world_size=world_size, tp=tp, pp=pp, dp=world_size // model, cp=cp,
                    gpus_per_node=gpus_per_node)
