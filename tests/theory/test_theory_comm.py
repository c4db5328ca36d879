"""Ring formulas, with values worked out by hand."""

import pytest

from playbook.theory.cost.comm import collective_seconds, sent_bytes


def test_ring_bytes_by_hand():
    assert sent_bytes("all_reduce", 1000, 4) == 1500  # 2 · 1000 · 3/4
    assert sent_bytes("all_gather", 1000, 4) == 750  # 1000 · 3/4
    assert sent_bytes("reduce_scatter", 800, 2) == 400
    assert sent_bytes("all_to_all", 900, 3) == 600
    assert sent_bytes("broadcast", 10, 8) == 10
    assert sent_bytes("all_reduce", 1000, 1) == 0


def test_alpha_beta_time():
    # 1 GB all-reduce over 8 ranks at 100 GB/s: 2·1e9·7/8 / 1e11 = 17.5 ms, plus 14 steps × 5 µs
    assert collective_seconds("all_reduce", 1e9, 8, 1e11) == pytest.approx(0.0175 + 14 * 5e-6)


@pytest.mark.parametrize(
    "args, message",
    [
        (("all_reduce", 1, 0), "n must be a positive integer"),
        (("gather_all", 1, 2), "unknown collective 'gather_all'"),
        (("all_reduce", -1, 2), "size must be >= 0"),
    ],
)
def test_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        sent_bytes(*args)
