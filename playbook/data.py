"""Training data made by code: a seeded sparse Markov chain the GPT can learn in a few hundred steps.

Every token has ``n_successors`` possible next tokens (chosen at random from the vocabulary with
the task's seed), taken with fixed probabilities ∝ 2^-i: (8, 4, 2, 1)/15 for four successors.
Because the next token depends only on the current one, the best any model can do is the entropy
of that successor distribution, the same for every position:

    loss floor = H(p) = -Σ pᵢ ln pᵢ  nats  (≈ 1.14 for four successors; ln V at initialisation)

so a notebook can draw the line the training loss should approach (``SyntheticTask.entropy_floor``).

Sharding: ``batch(step, global_batch, seq_len, rank, world_size)`` builds the whole global batch
from (seed, step) and returns rows ``rank·n : (rank+1)·n`` with n = global_batch / world_size, so
the ranks' slices, concatenated in rank order, are exactly the single-process batch. Data
parallel runs can then be compared with a single process step for step.
"""

from __future__ import annotations

import math

import torch

from playbook.config import divisors


def _mix(*values: int) -> int:
    """Hash integers to a 32-bit seed (splitmix64 steps). torch's CPU generator keeps only the low 32
    bits of a seed, so (seed, step) must be mixed, not concatenated."""
    state = 0x9E3779B97F4A7C15
    for v in values:
        state = (state ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        state = (state ^ (state >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 31
    return state & 0xFFFFFFFF


def rows_per_rank(global_batch: int, world_size: int) -> int:
    """Sequences each data-parallel rank gets; the global batch must split evenly over the ranks."""
    if global_batch <= 0 or world_size <= 0:
        raise ValueError(f"global_batch and world_size must be positive, got {global_batch}, {world_size}")
    if global_batch % world_size:
        raise ValueError(
            f"global_batch={global_batch} does not split evenly over world_size={world_size} ranks; "
            f"use world_size in {{{', '.join(map(str, divisors(global_batch)))}}} or a global_batch "
            f"that is a multiple of {world_size}"
        )
    return global_batch // world_size


class SyntheticTask:
    """A first-order Markov chain over ``vocab_size`` tokens with ``n_successors`` successors each.

    Deterministic in (seed, step) and independent of the global RNG.
    """

    def __init__(self, vocab_size: int, seed: int = 0, n_successors: int = 4):
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
        if not 1 <= n_successors <= vocab_size:
            raise ValueError(f"n_successors must be in 1..vocab_size={vocab_size}, got {n_successors}")
        self.vocab_size, self.seed, self.n_successors = vocab_size, seed, n_successors
        gen = torch.Generator().manual_seed(_mix(seed, 0xDA7A))
        # successors[t] = the n_successors tokens that may follow t, most likely first
        self.successors = torch.stack(
            [torch.randperm(vocab_size, generator=gen)[:n_successors] for _ in range(vocab_size)]
        )  # [vocab, n_successors]
        weights = 2.0 ** -torch.arange(n_successors, dtype=torch.float64)
        self.probs = weights / weights.sum()  # [n_successors], shared by every token

    def entropy_floor(self) -> float:
        """The lowest achievable mean cross-entropy, in nats: H(p) = -Σ pᵢ ln pᵢ."""
        return float(-(self.probs * self.probs.log()).sum())

    def initial_loss(self) -> float:
        """ln(vocab_size): the loss of a uniform guess, roughly where training starts (nats)."""
        return math.log(self.vocab_size)

    def transition_matrix(self) -> torch.Tensor:
        """P[i, j] = probability that token j follows token i. [vocab, vocab], rows sum to 1."""
        P = torch.zeros(self.vocab_size, self.vocab_size, dtype=torch.float64)
        P.scatter_(1, self.successors, self.probs.expand(self.vocab_size, -1).clone())
        return P

    def sequences(self, step: int, n_rows: int, length: int) -> torch.Tensor:
        """``n_rows`` chains of ``length`` tokens for this step. [n_rows, length] int64."""
        gen = torch.Generator().manual_seed(_mix(self.seed, step))
        seq = torch.empty(n_rows, length, dtype=torch.int64)
        seq[:, 0] = torch.randint(self.vocab_size, (n_rows,), generator=gen)  # uniform start
        choice = torch.multinomial(self.probs.float(), n_rows * (length - 1), replacement=True, generator=gen)
        choice = choice.view(n_rows, length - 1)  # [n_rows, length-1], which successor to take
        for t in range(1, length):
            seq[:, t] = self.successors[seq[:, t - 1], choice[:, t - 1]]
        return seq

    def batch(
        self,
        step: int,
        global_batch: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (tokens, targets), each [global_batch / world_size, seq_len] int64.

        targets[:, i] = the token after tokens[:, i]. Rows are the rank's contiguous slice of the
        global batch for ``step``; the two tensors are separate, contiguous storages.
        """
        if seq_len <= 0:
            raise ValueError(f"global_batch and seq_len must be positive, got {global_batch}, {seq_len}")
        if world_size > 0 and not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        local = rows_per_rank(global_batch, world_size)
        seq = self.sequences(step, global_batch, seq_len + 1)[rank * local : (rank + 1) * local]  # [local, seq+1]
        tokens = seq[:, :-1].clone()  # [local, seq_len], its own storage
        targets = seq[:, 1:].clone()  # [local, seq_len], its own storage
        if device is not None:
            tokens, targets = tokens.to(device), targets.to(device)
        return tokens, targets
