"""SyntheticTask: deterministic, shardable, with a computable loss floor."""

import math

import pytest
import torch

from playbook.data import SyntheticTask


def test_shapes_dtypes_and_shift():
    task = SyntheticTask(64, seed=1)
    tokens, targets = task.batch(0, 8, 16)
    assert tokens.shape == targets.shape == (8, 16)
    assert tokens.dtype == targets.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 64
    assert tokens.is_contiguous() and targets.is_contiguous()
    assert tokens.untyped_storage().data_ptr() != targets.untyped_storage().data_ptr()


def test_every_transition_is_allowed():
    task = SyntheticTask(32, seed=2)
    tokens, targets = task.batch(3, 16, 20)
    P = task.transition_matrix()
    assert torch.allclose(P.sum(1), torch.ones(32, dtype=torch.float64))
    assert bool((P[tokens, targets] > 0).all())


def test_deterministic_in_seed_and_step_not_global_rng():
    a = SyntheticTask(64, seed=0)
    torch.manual_seed(123)
    x1, _ = a.batch(5, 8, 16)
    torch.manual_seed(456)
    x2, _ = SyntheticTask(64, seed=0).batch(5, 8, 16)
    assert torch.equal(x1, x2)
    assert not torch.equal(x1, a.batch(6, 8, 16)[0])
    assert not torch.equal(x1, SyntheticTask(64, seed=1).batch(5, 8, 16)[0])
    # steps 2**32 apart are different batches (the seed is mixed, not truncated)
    assert not torch.equal(a.batch(0, 8, 16)[0], a.batch(2**32, 8, 16)[0])


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_rank_slices_concatenate_to_global_batch(world_size):
    task = SyntheticTask(64, seed=0)
    full_x, full_y = task.batch(7, 8, 12)
    parts = [task.batch(7, 8, 12, rank=r, world_size=world_size) for r in range(world_size)]
    assert all(p[0].shape == (8 // world_size, 12) for p in parts)
    assert torch.equal(torch.cat([p[0] for p in parts]), full_x)
    assert torch.equal(torch.cat([p[1] for p in parts]), full_y)


def test_bad_world_size_lists_valid_ones():
    task = SyntheticTask(64)
    with pytest.raises(ValueError, match=r"world_size in \{1, 2, 3, 4, 6, 12\}"):
        task.batch(0, 12, 8, rank=0, world_size=5)
    with pytest.raises(ValueError, match="rank"):
        task.batch(0, 8, 8, rank=2, world_size=2)


def test_entropy_floor():
    task = SyntheticTask(64, n_successors=4)
    p = [8 / 15, 4 / 15, 2 / 15, 1 / 15]
    assert task.entropy_floor() == pytest.approx(-sum(x * math.log(x) for x in p))
    assert SyntheticTask(64, n_successors=1).entropy_floor() == 0.0
    assert task.initial_loss() == pytest.approx(math.log(64))


def test_empirical_conditional_entropy_matches_floor():
    """The true next-token distribution's cross-entropy on sampled data is the floor (up to noise)."""
    task = SyntheticTask(16, seed=4)
    tokens, targets = task.batch(0, 256, 64)
    nll = -task.transition_matrix()[tokens, targets].log().mean().item()
    assert nll == pytest.approx(task.entropy_floor(), abs=0.02)
