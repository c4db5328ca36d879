"""Predict: what a pipeline schedule is, as data: each rank's ordered list of :class:`Action` (F, B, W,
sends, receives) in a :class:`Schedule`, and where each virtual stage lives (Megatron's loop
placement, the V, DualPipe's two chains). ``playbook.theory.pp.schedules`` builds them,
``playbook.theory.pp.simulator`` plays them, ``playbook.parallel.pp.executor`` runs them.

Pure Python; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    """One entry of a rank's list. ``kind``: F, B, W, send_F, recv_F, send_B, recv_B.
    ``mb`` the micro-batch, ``chunk`` this rank's model chunk, ``peer`` the other rank (comm only)."""

    kind: str
    mb: int
    chunk: int = 0
    peer: int = -1

    @property
    def is_compute(self) -> bool:
        return self.kind in ("F", "B", "W")

    def __str__(self) -> str:
        where = f".{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.mb}{where}" + (f"@{self.peer}" if self.peer >= 0 else "")


@dataclass(frozen=True)
class Schedule:
    """What every rank does in one step. ``actions[r]``: rank r's list, compute and comm."""

    name: str
    p: int
    m: int
    v: int
    split_backward: bool  # True: B is the input gradient only, W the weight gradient
    actions: tuple[tuple[Action, ...], ...]
    placement: str = "loop"  # "loop": chunk c of rank r is stage c·p + r; "v": chunk 0 stage r, chunk 1 2p−1−r
    # "dual" (DualPipe, playbook.theory.pp.dual): numbered as "v", but two chains of p stages

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    def stage(self, rank: int, chunk: int) -> int:
        """Virtual stage of ``chunk`` on ``rank`` (Megatron's placement: chunk c of rank r is stage c·p + r;
        the V placement: chunk 0 is stage r, chunk 1 stage 2p − 1 − r)."""
        if self.placement in ("v", "dual"):
            return rank if chunk == 0 else 2 * self.p - 1 - rank
        return chunk * self.p + rank

    def feeds(self, stage: int) -> bool:
        """Whether virtual stage ``stage`` sends its activations to ``stage + 1`` (DualPipe: not
        from the end of direction 0, stage p − 1, to the entry of direction 1, stage p)."""
        return 0 <= stage < self.n_stages - 1 and not (self.placement == "dual" and stage == self.p - 1)

    def pairs(self) -> set[tuple[int, int]]:
        """Every (micro-batch, chunk) a rank runs: each micro-batch on each chunk (DualPipe: the
        first half of the micro-batches on chunk 0, going down, the second half on chunk 1)."""
        if self.placement == "dual":
            half = self.m // 2
            return {(i, int(i >= half)) for i in range(self.m)}
        return {(i, c) for i in range(self.m) for c in range(self.v)}

    def place(self, stage: int) -> tuple[int, int]:
        """(rank, chunk) that holds virtual stage ``stage``."""
        if self.placement in ("v", "dual"):
            return (stage, 0) if stage < self.p else (2 * self.p - 1 - stage, 1)
        return stage % self.p, stage // self.p

    def compute(self, rank: int) -> list[Action]:
        return [a for a in self.actions[rank] if a.is_compute]

    def table(self) -> list[str]:
        """One line per rank with its compute order, e.g. ``rank 0: F0 F1 B0 F2 B1 ...``."""
        return [f"rank {r}: " + " ".join(str(a) for a in self.compute(r)) for r in range(self.p)]
