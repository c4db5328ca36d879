"""Speculative decoding predicted: Leviathan et al.'s tokens per verify against a simulation of the
acceptance process, the speed-up's limits, and the roofline's verify from memory-bound to
compute-bound, with the batch where speculation stops paying."""

import random

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving.serving import critical_batch, decode
from playbook.theory.serving.speculative import at_scale, best_k, crossover_batch, expected_tokens, speedup, verify

BIG, DRAFT, H100 = ModelConfig.preset("llama-3.1-70b"), ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")


@pytest.mark.parametrize("alpha,k", [(0.5, 1), (0.8, 4), (0.9, 7), (0.3, 3)])
def test_tokens_per_verify_is_the_mean_of_the_acceptance_process(alpha, k):
    rng, n, total = random.Random(0), 40000, 0
    for _ in range(n):  # accept each draft with probability alpha until one fails, then the target's token
        m = 0
        while m < k and rng.random() < alpha:
            m += 1
        total += m + 1
    assert expected_tokens(alpha, k) == pytest.approx(total / n, rel=0.01)


def test_speedup_limits():
    assert expected_tokens(1.0, 4) == 5 and expected_tokens(0.0, 4) == 1
    assert speedup(0.0, 3, draft_cost=0.1) < 1  # nothing accepted: the draft's time is lost
    assert speedup(0.8, 4, draft_cost=0.0) == pytest.approx(expected_tokens(0.8, 4))  # a free draft
    # a costlier draft wants fewer tokens per step
    assert best_k(0.8, draft_cost=0.05) > best_k(0.8, draft_cost=0.3) >= 1
    with pytest.raises(ValueError, match="probability"):
        expected_tokens(1.5, 2)


def test_verify_costs_one_step_when_memory_bound_and_k_plus_1_when_compute_bound():
    small = verify(BIG, H100, context=2048, batch=1, k=4, tp=8)
    plain = decode(BIG, H100, context=2048, batch=1, tp=8, latency="by-size")
    assert small.bound == "memory" and small.seconds == pytest.approx(plain.seconds, rel=0.05)
    huge = verify(BIG, H100, context=2048, batch=4096, k=4, tp=8)
    plain = decode(BIG, H100, context=2048, batch=4096, tp=8, latency="by-size")
    assert huge.bound == "compute" and huge.compute == pytest.approx(5 * plain.compute)


def test_speculation_stops_paying_past_the_crossover_batch():
    options = dict(draft=DRAFT, alpha=0.8, k=4, context=2048, tp=8)
    assert at_scale(BIG, H100, batch=1, **options)["speedup"] > 1.5
    cross = crossover_batch(BIG, H100, **options)
    assert (
        at_scale(BIG, H100, batch=cross - 1, **options)["speedup"]
        > 1
        >= at_scale(BIG, H100, batch=cross, **options)["speedup"]
    )
    # the verify's B·(k + 1) tokens have passed the critical batch there: compute-bound
    assert (
        cross * 5 > critical_batch(BIG, H100)
        and at_scale(BIG, H100, batch=cross, **options)["verify_bound"] == "compute"
    )
    # more drafts per step stop paying at a smaller batch
    assert crossover_batch(BIG, H100, **{**options, "k": 8}) < cross < crossover_batch(BIG, H100, **{**options, "k": 1})


def test_chi_square_against_a_known_case_and_its_threshold():
    from playbook.theory.serving.speculative import chi_square, chi_square_threshold

    # a fair die thrown 600 times: (observed − 100)² / 100 summed by hand
    stat, df = chi_square([90, 110, 100, 95, 105, 100], [1 / 6] * 6)
    assert df == 5 and stat == pytest.approx((100 + 100 + 0 + 25 + 25 + 0) / 100)
    # tables: 20.52 at df 5, 149.45 at df 100 (p = 0.001); Wilson–Hilferty within 2 % and 1 %
    assert chi_square_threshold(5) == pytest.approx(20.52, rel=0.02)
    assert chi_square_threshold(100) == pytest.approx(149.45, rel=0.01)
    # cells expected fewer than 5 times are pooled into one
    assert chi_square([10, 0, 1], [0.98, 0.01, 0.01])[1] == 1
