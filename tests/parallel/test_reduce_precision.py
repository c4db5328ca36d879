"""The gradient reduction in fp32 and bf16 on real gloo ranks (``parallel.reduce_precision``), held to
the summation error bound of any order (Higham 2002, §4.2: n terms, each addition rounded with unit
roundoff u, |error| ≤ γ₍ₙ₋₁₎ Σ|xᵢ|, γₖ = k·u / (1 − k·u)) rather than to a measured tolerance: fp32 within
its bound (u = 2⁻²⁴); bf16 within the cast error Σ|xᵢ − bf16(xᵢ)| plus its bound (u = 2⁻⁸, plus 2⁻²⁴ for
gloo adding in fp32 before rounding to bf16); and bf16 outside fp32's bound on some element, the loss
Llama 3 reduces in fp32 to avoid."""

import torch

from playbook.parallel.training import TrainSetup
from playbook.parallel.reduce_precision import error_rows, reduce_rank

SETUP = TrainSetup(global_batch=8, seq_len=32)


def gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)


def test_fp32_and_bf16_sums_within_their_bounds(ranks4):
    answers = ranks4.run(reduce_rank, SETUP)
    r = answers[0]
    every, exact = r["contributions"].double(), r["exact"]  # [4, params], [params]
    n = every.shape[0]
    fp64 = gamma(n - 1, 2.0**-53) * every.abs().sum(0)  # the reference's own rounding
    fp32_bound = gamma(n - 1, 2.0**-24) * every.abs().sum(0) + fp64
    assert ((r["fp32"] - exact).abs() <= fp32_bound).all()
    cast = every.to(torch.bfloat16).double()  # [4, params]
    bf16_bound = (every - cast).abs().sum(0) + gamma(n - 1, 2.0**-8 + 2.0**-24) * cast.abs().sum(0) + fp64
    assert ((r["bf16"] - exact).abs() <= bf16_bound).all()
    assert ((r["bf16"] - exact).abs() > fp32_bound).any()  # bf16 loses what fp32 keeps
    assert all(torch.equal(a["bf16"], r["bf16"]) for a in answers)  # every rank holds the same sum
    rows = {row["reduction"]: row for row in error_rows(r)}
    assert rows["fp32"]["elements with only their largest term left"] == 0
