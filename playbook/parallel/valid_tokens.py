"""The loss over valid tokens: one divisor, the global count of valid tokens (chapter 8).

With padding, SFT loss masks or packed documents of different lengths, some target positions carry
no loss (``IGNORE``, ``F.cross_entropy``'s ``ignore_index``). The global batch's loss is then
Σ valid-token losses / N, N the valid tokens of the whole global batch: every rank's share is Σ its
valid-token losses / N, so N must be known on every rank before the backward, by one all-reduce of
the per-rank counts (or a count the data loader computes ahead of the step). Dividing by anything
local instead (the mean of each rank's tokens, averaged over ranks as DDP averages; or the mean of
each micro-batch, divided by the m accumulation steps) weighs a token by 1 / (its own rank's or
micro-batch's count): a biased loss and gradient whenever the counts differ. That was the
gradient-accumulation loss bug of Hugging Face Transformers found in October 2024 and fixed in
v4.46 by passing the step's count (``num_items_in_batch``) to the loss.

``valid_token_rank`` runs the three rules on real data-parallel ranks over the world, one row of
the global batch per micro-batch; ``one_process`` is the single process's mean over every valid
token of the same batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from playbook.model.gpt import GPT
from playbook.parallel.training import TrainSetup

IGNORE = -100  # F.cross_entropy's default ignore_index
RULES = ("Σ / global valid count", "mean per rank, averaged", "mean per micro-batch, averaged")


def check_lengths(setup: TrainSetup, lengths: list[int], world: int = 1) -> None:
    """One line naming the constraint: a length per row of the global batch, each in 1..seq_len."""
    if len(lengths) != setup.global_batch:
        raise ValueError(f"give one valid length per row: {setup.global_batch} rows, got {len(lengths)} lengths")
    if not all(1 <= n <= setup.seq_len for n in lengths):
        raise ValueError(
            f"every valid length must be in 1..{setup.seq_len} (a row with none has no mean), got {lengths}"
        )
    if setup.global_batch % world:
        raise ValueError(f"global_batch={setup.global_batch} must split evenly over {world} ranks")


def padded_batch(setup: TrainSetup, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch with row r's targets past ``lengths[r]`` set to ``IGNORE``: tokens, targets [B, S]."""
    tokens, targets = setup.task().batch(0, setup.global_batch, setup.seq_len)
    positions = torch.arange(setup.seq_len)  # [S]
    targets = targets.masked_fill(positions >= torch.tensor(lengths)[:, None], IGNORE)  # [B, S]
    return tokens, targets


def _loss_sum(model, tokens, targets) -> torch.Tensor:
    logits = model(tokens)  # [b, S, vocab]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")


def _flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # [params]


def one_process(setup: TrainSetup, lengths: list[int], dtype=torch.float32) -> tuple[float, torch.Tensor]:
    """(loss, flat gradient [params]) of the mean over every valid token of the global batch."""
    check_lengths(setup, lengths)
    model = GPT(setup.config(), seed=setup.seed).to(dtype)
    tokens, targets = padded_batch(setup, lengths)
    logits = model(tokens)  # [B, S, vocab]
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    loss.backward()
    return float(loss.detach()), _flat_grad(model)


def valid_token_rank(ctx, setup: TrainSetup, lengths: list[int], dtype=torch.float32) -> dict:
    """Each rule of ``RULES`` on this rank's rows (data parallel over the world, one row per
    micro-batch): {rule: (the global loss, the flat gradient [params] after the sum or average)}."""
    world, rank = dist.get_world_size(), dist.get_rank()
    check_lengths(setup, lengths, world)
    tokens, targets = padded_batch(setup, lengths)
    rows = setup.global_batch // world
    mine = slice(rank * rows, (rank + 1) * rows)
    tokens, targets = tokens[mine], targets[mine]  # [rows, S]
    valid = (targets != IGNORE).sum()  # this rank's valid tokens
    count = valid.clone()
    dist.all_reduce(count)  # N: the global batch's valid tokens, before any backward
    out = {}
    for rule in RULES:
        model = GPT(setup.config(), seed=setup.seed).to(dtype)
        loss = torch.zeros((), dtype=dtype)
        for j in range(rows):  # gradient accumulation, one row per micro-batch
            part = _loss_sum(model, tokens[j : j + 1], targets[j : j + 1])
            if rule == RULES[0]:
                share = part / count  # this micro-batch's share of the global mean
            elif rule == RULES[1]:
                share = part / valid  # this rank's mean, accumulated over its micro-batches
            else:
                share = part / (targets[j] != IGNORE).sum() / rows  # the micro-batch's mean / m
            share.backward()
            loss += share.detach()
        grad = _flat_grad(model)
        dist.all_reduce(grad)  # SUM over the data ranks
        dist.all_reduce(loss)
        if rule != RULES[0]:  # the local means are averaged, as DDP averages
            grad, loss = grad / world, loss / world
        out[rule] = (float(loss), grad)
    return out


def bias_rows(answers: list[dict], reference: tuple[float, torch.Tensor]) -> list[dict]:
    """One row per rule: its loss and gradient against the single process's."""
    loss, grad = reference
    got = answers[0]
    return [
        {
            "rule": rule,
            "loss": got[rule][0],
            "loss rel. error": abs(got[rule][0] - loss) / abs(loss),
            "gradient rel. L2 error": float((got[rule][1] - grad).norm() / grad.norm()),
        }
        for rule in RULES
    ]
