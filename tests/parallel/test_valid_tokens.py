"""The loss over valid tokens on real ranks (``parallel.valid_tokens``), in float64 so that the bound
is rounding of a few additions (measured 4e-16), not float32 luck: Σ valid-token losses / the global
count (one all-reduce of the count) gives the single process's loss and gradient; dividing by a
rank's or a micro-batch's own count is biased when the counts differ, and is not when they are equal
(every token then gets the same weight 1/N, derived, not measured)."""

import pytest
import torch

from playbook.parallel.training import TrainSetup
from playbook.parallel.valid_tokens import RULES, bias_rows, one_process, valid_token_rank

SETUP = TrainSetup(global_batch=8, seq_len=16)  # 2 rows per rank on 4 ranks: 2 micro-batches each
UNEVEN = [16, 1, 9, 3, 16, 2, 12, 5]
EXACT = 1e-12  # float64: the same sums in another order


def rows(ranks4, lengths):
    answers = ranks4.run(valid_token_rank, SETUP, lengths, torch.float64)
    return {r["rule"]: r for r in bias_rows(answers, one_process(SETUP, lengths, torch.float64))}


def test_global_valid_count_is_the_one_process_mean_and_local_means_are_biased(ranks4):
    got = rows(ranks4, UNEVEN)
    right = got[RULES[0]]
    assert right["loss rel. error"] <= EXACT and right["gradient rel. L2 error"] <= EXACT
    for rule in RULES[1:]:  # a token's weight is 1/(its rank's or micro-batch's count), not 1/N
        assert got[rule]["gradient rel. L2 error"] > 1e-3, rule


def test_equal_counts_leave_every_rule_unbiased(ranks4):
    got = rows(ranks4, [10] * SETUP.global_batch)
    assert all(r["gradient rel. L2 error"] <= EXACT and r["loss rel. error"] <= EXACT for r in got.values())


def test_lengths_are_checked_in_one_line():
    with pytest.raises(ValueError, match="every valid length must be in 1..16"):
        one_process(SETUP, [0] * 8)
    with pytest.raises(ValueError, match="one valid length per row: 8 rows"):
        one_process(SETUP, [3])
