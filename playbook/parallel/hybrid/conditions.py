"""The conditions a real run trains under, made on purpose: a straggler and a slow input pipeline.

- ``--slow-rank R --slow-ms MS``: rank R sleeps MS milliseconds in every step, before its forward
  (a real ``time.sleep`` inside the step: a slow host, a thermal throttle, a noisy neighbour). The
  other ranks wait for it in the next collective; ``measure.steps`` finds it from the per-rank own
  work (step − time in collectives).
- ``--loader-workers N --loader-delay-ms MS --prefetch K``: each rank's batches come from a real
  ``torch.utils.data.DataLoader`` (``parallel.loader``: N worker processes, K batches ahead each,
  MS of stand-in work per batch); the rank's wait for a batch is an "input wait" span on the timeline.

Neither changes a number the run computes: parity with the single process holds (a test runs both).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from playbook.parallel.loader import RankLoader, check_loader

STRAGGLER = "slow (injected)"  # the sleep's span name on the timeline
KEYS = ("slow_rank", "slow_ms", "loader_workers", "loader_delay_ms", "prefetch")


@dataclass(frozen=True)
class Conditions:
    slow_rank: int | None = None
    slow_ms: float = 0.0
    loader_workers: int | None = None  # None: no DataLoader (the loop makes each batch inline)
    loader_delay_ms: float = 0.0
    prefetch: int | None = None

    @property
    def loader(self) -> bool:
        return self.loader_workers is not None or self.loader_delay_ms > 0 or self.prefetch is not None

    def check(self, world: int) -> None:
        """One line per option that cannot work here, before any rank starts."""
        if self.slow_rank is not None and not (isinstance(self.slow_rank, int) and 0 <= self.slow_rank < world):
            raise ValueError(f"--slow-rank {self.slow_rank} is not a rank of this layout's {world}; try --slow-rank {world - 1}")
        if not (isinstance(self.slow_ms, (int, float)) and 0 <= self.slow_ms <= 60_000):
            raise ValueError(f"--slow-ms must be between 0 and 60000, got {self.slow_ms!r}; e.g. --slow-ms 50")
        if self.slow_ms and self.slow_rank is None:
            raise ValueError(f"--slow-ms {self.slow_ms:g} slows one rank: name it with --slow-rank (e.g. --slow-rank 1)")
        if self.slow_rank is not None and not self.slow_ms:
            raise ValueError(f"--slow-rank {self.slow_rank} needs --slow-ms, the milliseconds it loses a step; e.g. --slow-ms 50")
        if self.loader:
            check_loader(self.loader_workers or 0, self.prefetch, self.loader_delay_ms / 1e3)

    def as_dict(self) -> dict:
        return asdict(self)


def split(options: dict) -> tuple[Conditions, dict]:
    """(the conditions among ``options``, the rest: the layout's ``Plan`` keywords)."""
    mine = {k: options[k] for k in KEYS if k in options and options[k] is not None}
    return Conditions(**mine), {k: v for k, v in options.items() if k not in KEYS}


def add_arguments(parser) -> None:
    parser.add_argument("--slow-rank", type=int, default=None, help="a straggler: this rank sleeps --slow-ms every step")
    parser.add_argument("--slow-ms", type=float, default=None, help="milliseconds the --slow-rank loses every step")
    parser.add_argument(
        "--loader-workers", type=int, default=None, help="batches from a torch DataLoader with this many workers per rank"
    )
    parser.add_argument(
        "--loader-delay-ms", type=float, default=None, help="stand-in work per batch in the loader (reading, decoding)"
    )
    parser.add_argument("--prefetch", type=int, default=None, help="batches each loader worker keeps ahead")


def batches(make, ctx, steps: int, c: Conditions):
    """The batch of each step: ``make`` inline, or through this rank's ``RankLoader``; and a
    ``close()`` to stop its workers when training ends."""
    if not c.loader:
        return make, lambda: None
    loader = RankLoader(
        make, steps, workers=c.loader_workers or 0, prefetch=c.prefetch, delay_s=c.loader_delay_ms / 1e3, tracer=ctx.tracer
    )
    return loader, loader.close


def slowed(hooks: dict, ctx, c: Conditions) -> dict:
    """``hooks`` with the straggler's sleep before its forward (this rank only)."""
    if c.slow_rank != ctx.rank or not c.slow_ms:
        return hooks
    inner = hooks["forward_backward"]

    def forward_backward(model, tokens, targets):
        with ctx.tracer.span(STRAGGLER):
            time.sleep(c.slow_ms / 1e3)
        return inner(model, tokens, targets)

    return {**hooks, "forward_backward": forward_backward}
