"""The parallel layout: how many ranks along each axis, and which rank sits where.

``ParallelDims(dp, tp, pp, cp, ep)`` is pure Python (no torch): the calculators in ``theory/``,
the rank grid in ``viz/`` and the runtime mesh (``playbook.cluster.mesh``) all read the same
object. The world is a 4-D grid, ``world = pp × dp × cp × tp``; a rank's coordinates are read off
its number with **tp varying fastest**, then cp, then dp, and pp slowest::

    rank = tp_i + tp · (cp_i + cp · (dp_i + dp · pp_i))

Why this order (Narayanan et al. 2021, arXiv:2104.04473, §3.2, takeaway 1: TP inside a server; Llama 3,
Dubey et al. 2024, §3.3.2, whose order is [TP, CP, PP, DP] from fastest to slowest): consecutive
ranks share a node, and tensor parallelism talks most (four activation collectives per layer),
context parallelism next (K/V every layer), data parallelism once per step, and the pipeline only
at stage boundaries, point to point. We put pp outermost as Megatron-LM does, so that a pipeline
can cross the slowest links; Llama 3 puts dp there instead, a choice the hybrid chapter discusses.

Expert parallelism borrows ranks, it adds none (DeepSpeed-MoE, arXiv:2201.05596 §5; torchtitan):
the ``dp × cp`` ranks that hold replicated dense weights are cut into groups of ``ep`` consecutive
ranks; each such group splits the experts, and the ranks at the same place in every group hold the
same experts (their *replicas*, size ``dp·cp/ep``), whose gradients are averaged among themselves.

Groups (``groups(axis)``): ``tp``, ``cp``, ``dp``, ``pp``; ``dp_cp`` (replicated weights' gradients),
``ep`` (the all-to-all) and ``ep_replica`` (expert gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.config import divisors

AXES = ("tp", "cp", "dp", "pp")  # fastest to slowest
GROUP_AXES = ("tp", "cp", "dp", "pp", "dp_cp", "ep", "ep_replica")


def _options(n: int) -> str:
    return "{" + ", ".join(map(str, divisors(n))) + "}"


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of parallelism along each axis; ``world`` = dp·tp·pp·cp (ep lives inside dp·cp)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for axis in ("dp", "tp", "pp", "cp", "ep"):
            value = getattr(self, axis)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{axis} must be a positive integer, got {value!r}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide dp·cp={self.dp * self.cp} (experts are split inside the data-parallel "
                f"ranks); try ep in {_options(self.dp * self.cp)} or a larger dp"
            )

    # ---- sizes ----
    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def size(self, axis: str) -> int:
        """Ranks in one group of ``axis`` (see ``GROUP_AXES``)."""
        if axis in AXES:
            return getattr(self, axis)
        if axis == "dp_cp":
            return self.dp * self.cp
        if axis == "ep":
            return self.ep
        if axis == "ep_replica":
            return self.dp * self.cp // self.ep
        raise ValueError(f"unknown axis {axis!r}; axes are {', '.join(GROUP_AXES)}")

    @property
    def active(self) -> list[str]:
        """The axes with more than one rank, fastest first (``ep`` after ``pp``)."""
        return [a for a in (*AXES, "ep") if getattr(self, a) > 1]

    def __str__(self) -> str:
        parts = [f"{a}{getattr(self, a)}" for a in ("dp", "tp", "pp", "cp", "ep") if getattr(self, a) > 1]
        return "×".join(parts) or "single"

    # ---- rank <-> coordinates ----
    def coords(self, rank: int) -> dict[str, int]:
        """{tp, cp, dp, pp} indices of ``rank`` (and ``ep``: its index inside its expert group)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside this layout's {self.world} ranks (0..{self.world - 1})")
        out, rest = {}, rank
        for axis in AXES:
            out[axis] = rest % getattr(self, axis)
            rest //= getattr(self, axis)
        out["ep"] = (out["dp"] * self.cp + out["cp"]) % self.ep
        return out

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The global rank at these coordinates."""
        for axis, value in (("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)):
            if not 0 <= value < getattr(self, axis):
                raise ValueError(f"{axis}={value} is outside 0..{getattr(self, axis) - 1}")
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def data_index(self, rank: int) -> int:
        """Position among the dp·cp ranks that hold the same weights: dp_i·cp + cp_i."""
        c = self.coords(rank)
        return c["dp"] * self.cp + c["cp"]

    def ranks_along(self, axis: str, rank: int) -> list[int]:
        """Every rank of ``rank``'s group along ``axis``, in group order (group rank 0 first)."""
        c = self.coords(rank)
        if axis in AXES:
            return [self.rank(**{**_grid(c), axis: i}) for i in range(getattr(self, axis))]
        members = [self.rank(tp=c["tp"], pp=c["pp"], dp=j // self.cp, cp=j % self.cp) for j in range(self.dp * self.cp)]
        j = self.data_index(rank)
        if axis == "dp_cp":
            return members
        if axis == "ep":
            return members[j - j % self.ep : j - j % self.ep + self.ep]
        if axis == "ep_replica":
            return members[j % self.ep :: self.ep]
        raise ValueError(f"unknown axis {axis!r}; axes are {', '.join(GROUP_AXES)}")

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, each a list of global ranks, ordered by their first rank."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world):
            seen.setdefault(tuple(self.ranks_along(axis, r)), None)
        return sorted((list(g) for g in seen), key=lambda g: g[0])

    def shown_axes(self) -> list[str]:
        """The group axes worth listing: more than one rank, and the expert ones only with ep > 1."""
        return [a for a in GROUP_AXES if self.size(a) > 1 and (self.ep > 1 or not a.startswith("ep"))]

    def table(self) -> list[dict]:
        """One row per rank: its coordinates and the ranks of each of its groups (for a notebook table)."""
        rows = []
        for r in range(self.world):
            row = {"rank": r, **{a: self.coords(r)[a] for a in AXES}}
            for axis in self.shown_axes():
                row[f"{axis} group"] = self.ranks_along(axis, r)
            rows.append(row)
        return rows

    def describe(self) -> str:
        """Every group of every axis with more than one rank, one line per axis."""
        lines = [f"{self} on {self.world} rank(s); order: tp fastest, then cp, dp, pp"]
        for axis in self.shown_axes():
            lines.append(f"  {axis:<10} size {self.size(axis)}: " + " ".join(map(str, self.groups(axis))))
        return "\n".join(lines)

    # ---- validation against a model and a run ----
    def check(
        self,
        cfg,
        *,
        seq_len: int | None = None,
        global_batch: int | None = None,
        zigzag: bool = False,
        microbatches: int | None = None,
    ) -> None:
        """Raise ``ValueError`` naming the first constraint this layout breaks for ``cfg`` (a
        ``ModelConfig``) and values that would work. Called before any rank starts."""
        t = self.tp
        for what, n in (
            ("n_heads", cfg.n_heads),
            ("kv_heads", cfg.kv_heads),
            ("ffn_hidden", cfg.ffn_hidden),
            ("vocab_size", cfg.vocab_size),
        ):
            if t > 1 and n % t:
                ok = [
                    d
                    for d in divisors(cfg.n_heads)
                    if cfg.kv_heads % d == 0 and cfg.ffn_hidden % d == 0 and cfg.vocab_size % d == 0
                ]
                raise ValueError(
                    f"tp={t} must divide {what}={n}; tp in {{{', '.join(map(str, ok))}}} divides heads, "
                    "kv heads, ffn and vocabulary of this model"
                )
        if self.pp > cfg.n_layers:
            raise ValueError(
                f"pp={self.pp} is more stages than the model's {cfg.n_layers} layers; use pp <= {cfg.n_layers}"
            )
        if self.ep > 1:
            if not cfg.is_moe:
                raise ValueError(
                    f"ep={self.ep} needs a mixture-of-experts model (n_experts > 0); use ep=1 or a MoE "
                    "preset such as gpt-tiny-moe"
                )
            if cfg.n_experts % self.ep:
                raise ValueError(
                    f"ep={self.ep} must divide n_experts={cfg.n_experts}; try ep in {_options(cfg.n_experts)}"
                )
        if seq_len is not None and self.cp > 1:
            chunks = 2 * self.cp if zigzag else self.cp
            if seq_len % chunks:
                raise ValueError(
                    f"seq_len={seq_len} must split into {chunks} equal chunks for cp={self.cp}"
                    f"{' with zig-zag' if zigzag else ''}; use a multiple of {chunks}"
                )
        if global_batch is not None:
            rows = self.dp * (microbatches or 1)
            if global_batch % rows:
                what = f"dp·microbatches={self.dp}·{microbatches}" if microbatches else f"dp={self.dp}"
                raise ValueError(
                    f"global_batch={global_batch} does not split over {what}; use a global batch that "
                    f"is a multiple of {rows}"
                )


def _grid(c: dict[str, int]) -> dict[str, int]:
    return {a: c[a] for a in AXES}


def layouts(world: int, axes=("dp", "tp", "pp", "cp")) -> list[ParallelDims]:
    """Every ParallelDims over ``axes`` whose product is ``world`` (ep left at 1)."""
    out = [{}]
    for axis in axes:
        out = [{**d, axis: k} for d in out for k in divisors(world)]
    return [ParallelDims(**d) for d in out if _product(d) == world]


def _product(d: dict) -> int:
    n = 1
    for v in d.values():
        n *= v
    return n
