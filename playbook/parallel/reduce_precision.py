"""The precision of a gradient reduction: the same gradients summed over real ranks in fp32 and in bf16.

Every rank computes its fp32 gradient of the same model on its rows; the sum over the ranks is
then taken four ways, each a real ``all_reduce`` (gloo sums bf16 too, rounding every partial sum to
bf16), against the exact sum (fp64 holds a sum of 8 fp32 numbers almost exactly):

- fp32: what the parity runs of this book do;
- bf16 inputs, fp32 sum: the error of casting each rank's gradient alone;
- bf16: cast and summed in bf16, 8 significant bits for every partial sum.

Llama 3 keeps the gradients in fp32 for this reason: "we use FP32 gradient accumulation during
backward computation over multiple micro-batches and also reduce-scatter gradients in FP32 across
data parallel workers in FSDP" (Dubey et al. 2024, arXiv:2407.21783, §3.3.2).

An element *loses its small contributions* when the reduced value is what the largest contribution
alone would give (rounded to the format) although the others add up to something: in bf16 a term
below half a unit in the last place of the partial sum vanishes, as in long accumulations.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from playbook.model.gpt import GPT
from playbook.parallel.training import TrainSetup

WAYS = {
    "fp32": (torch.float32, torch.float32),
    "bf16 inputs, fp32 sum": (torch.bfloat16, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
}  # name -> (the inputs' format, the sum's format)


def local_gradient(setup: TrainSetup, rank: int, world: int) -> torch.Tensor:
    """This rank's fp32 gradient [params] of its share of the first global batch's mean loss (the
    mean of its rows × rows / global_batch: the shares' gradients sum to the global one)."""
    model = GPT(setup.config(), seed=setup.seed)
    tokens, targets = setup.task().batch(0, setup.global_batch, setup.seq_len, rank, world)  # [rows, S]
    _, loss = model(tokens, targets)
    (loss * tokens.shape[0] / setup.global_batch).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # [params]


def reduce_rank(ctx, setup: TrainSetup) -> dict:
    """On every rank: the exact sum [params] (fp64) and each way of ``WAYS`` (in fp64 after the sum);
    on rank 0 also every rank's contribution [world, params] (to find the largest one per element)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = local_gradient(setup, rank, world)  # [params] fp32
    exact = g.double()
    dist.all_reduce(exact)
    out = {"exact": exact}
    for name, (given, summed) in WAYS.items():
        x = g.to(given).to(summed).clone()  # [params], a copy: the all-reduce writes in place
        dist.all_reduce(x)  # the reduction in ``summed``
        out[name] = x.double()
    every = torch.empty(world * g.numel())  # [world · params]
    dist.all_gather_single(every, g)
    if rank == 0:  # one copy comes back
        out["contributions"] = every.view(world, -1)  # [world, params]
    return out


def error_rows(result: dict) -> list[dict]:
    """Per way: the error against the exact sum (relative L2 over the whole gradient, the largest
    relative error of an element whose sum is at least 1% of the largest), and the elements that lost
    every contribution but the largest (module docstring)."""
    exact, every = result["exact"], result["contributions"]  # [params], [world, params]
    big = exact.abs() >= 1e-2 * exact.abs().max()
    largest = every.gather(0, every.abs().argmax(0, keepdim=True))[0]  # [params] the largest contribution
    rest = exact - largest.double()  # what the other ranks add
    rows = []
    for name, (given, summed) in WAYS.items():
        got = result[name]
        alone = largest.to(given).to(summed).double()  # the largest contribution alone, in the sum's format
        lost = (got == alone) & (rest != 0)
        rows.append(
            {
                "reduction": name,
                "rel. L2 error": float((got - exact).norm() / exact.norm()),
                "max rel. error (|sum| ≥ 1% of max)": float(((got - exact).abs() / exact.abs())[big].max()),
                "elements with only their largest term left": int(lost.sum()),
                "of elements": exact.numel(),
            }
        )
    return rows
