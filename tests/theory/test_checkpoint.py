"""theory.checkpoint: rectangles of a flat run, the write-once rule, and bytes per rank (no torch run).
The real-rank check that these bytes are what DCP writes is tests/parallel/checkpoint/test_reshard.py."""

import pytest

from playbook.config import ModelConfig
from playbook.dims import ParallelDims as D
from playbook.theory.checkpoint import Piece, bytes_per_rank, holdings, rectangles, writers
from playbook.theory.checkpoint.writes import RNG_BYTES

TINY, MOE = ModelConfig.preset("gpt-tiny"), ModelConfig.preset("gpt-tiny-moe")


@pytest.mark.parametrize("shape", [(7,), (3, 5), (4, 4), (1, 9)])
def test_every_run_of_elements_is_at_most_three_rectangles_covering_exactly_it(shape):
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    cols = shape[-1] if len(shape) > 1 else 1
    for lo in range(n + 1):
        for hi in range(lo, n + 1):
            rects = rectangles(shape, lo, hi)
            assert len(rects) <= (3 if len(shape) == 2 else 1)
            cells = set()
            for off, size in rects:
                if len(shape) == 1:
                    cells |= set(range(off[0], off[0] + size[0]))
                else:
                    cells |= {
                        (r * cols + c) for r in range(off[0], off[0] + size[0]) for c in range(off[1], off[1] + size[1])
                    }
            assert cells == set(range(lo, hi)), (shape, lo, hi, rects)


LAYOUTS = [
    (TINY, D(), 0),
    (TINY, D(dp=2, tp=2), 1),
    (TINY, D(dp=2, pp=2), 3),
    (TINY, D(dp=2, tp=2, pp=2, cp=2), 1),
    (MOE, D(dp=4, ep=2), 2),
    (MOE, D(dp=2, ep=2, tp=2), 0),
    (ModelConfig.preset("gpt-tiny-tied"), D(dp=2, pp=2), 3),
]


@pytest.mark.parametrize("cfg, dims, zero", LAYOUTS, ids=[f"{c.name} {d} z{z}" for c, d, z in LAYOUTS])
def test_the_written_pieces_cover_every_parameter_exactly_once(cfg, dims, zero):
    """Over all ranks the written weights are the model's parameter count, with no element twice."""
    held = [holdings(cfg, dims, r, zero=zero) for r in range(dims.world)]
    written = [p for rank in writers(held) for p in rank]
    assert sum(p.numel for p in written) == cfg.num_params()
    rows = bytes_per_rank(cfg, dims, zero=zero)
    assert sum(r["weights"] for r in rows) == 4 * cfg.num_params()
    assert all(r["moments"] == 2 * r["weights"] and r["rng"] == RNG_BYTES for r in rows)
    assert [r["data"] > 0 for r in rows] == [True] + [False] * (dims.world - 1)


def test_zero_spreads_the_writes_and_replicas_are_written_by_the_lowest_rank():
    plain = bytes_per_rank(TINY, D(dp=4))
    sharded = bytes_per_rank(TINY, D(dp=4), zero=1)
    assert plain[0]["weights"] == 4 * TINY.num_params() and all(r["weights"] == 0 for r in plain[1:])
    assert max(r["weights"] for r in sharded) <= 4 * (-(-TINY.num_params() // 4) + 4 * 8)  # ≈ 1/4 each


def test_a_piece_a_lower_rank_wrote_only_in_part_is_refused():
    a, b = Piece("w", (0, 0), (2, 4)), Piece("w", (1, 0), (2, 4))
    with pytest.raises(ValueError, match="partly"):
        writers([[a], [b]])
    assert writers([[a], [a]]) == [[a], []]
