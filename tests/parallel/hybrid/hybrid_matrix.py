"""The composition matrix of ``playbook run hybrid`` (issue 26): what a layout switches on, and the
one check every real-rank layout of tests/test_hybrid*.py passes.

``check`` runs a layout on real ranks against the single process on the same global batch (loss,
every gradient, parameters after 3 AdamW steps within ``parallel.parity``'s bounds; an MoE model in
m > 1 micro-batches against the single process that routes the same micro-batches), bytes per rank
per step on every mesh axis measured == predicted (``theory.hybrid.hybrid``), and memory per category of
every rank measured == predicted to the byte, every category modelled unless the caller names it.

``features`` reads the switches of FEATURES from a setup and a plan; tests/parallel/hybrid/test_hybrid_matrix.py
gathers every layout list of the rank tests (its MATRIX) and holds it to every pair of features that
``theory.hybrid.composition.refusal`` accepts.
"""

from __future__ import annotations

import pytest
import torch

from playbook.parallel.hybrid import moe as hybrid_moe
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.merge import comm_table, merge
from playbook.parallel.parity import assert_parity
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup
from playbook.theory.pp.schedules import is_split

DENSE, MOE, TIED = TrainSetup(), TrainSetup(model="gpt-tiny-moe"), TrainSetup(model="gpt-tiny-tied")
FEATURES = (
    "dp",
    "tp",
    "sp",
    "pp",
    "cp",
    "ep",
    "zero1",
    "zero2",
    "zero3",
    "recompute selective",
    "recompute full",
    "virtual stages",
    "split backward",
    "tied embedding",
    "m>1 at pp=1",
)


def features(setup: TrainSetup, plan: Plan) -> frozenset[str]:
    """Which of FEATURES ``plan`` switches on for ``setup``'s model: an axis of degree > 1 (ep: the
    experts of an MoE model split), SP, a ZeRO stage, a recompute mode, v > 1 chunks per pipeline
    rank (interleaved, the V), a split backward (ZB-H1, the V), a tied embedding, gradient
    accumulation without a pipeline."""
    d = plan.dims
    on = {axis for axis in ("dp", "tp", "pp", "cp", "ep") if getattr(d, axis) > 1}
    on |= {"sp"} if plan.sequence_parallel else set()
    on |= {f"zero{plan.zero}"} if plan.zero else set()
    on |= {f"recompute {plan.recompute}"} if plan.recompute != "none" else set()
    on |= {"virtual stages"} if plan.v > 1 else set()
    on |= {"split backward"} if d.pp > 1 and is_split(plan.schedule) else set()
    on |= {"tied embedding"} if setup.config().tie_embeddings else set()
    on |= {"m>1 at pp=1"} if d.pp == 1 and plan.m > 1 else set()
    return frozenset(on)


def axes_used(answers: list[dict]) -> set:
    """The mesh axes whose collectives carried bytes in a step (the loss report left out)."""
    return {s["axis"] for a in answers for s in a["spans"] if s["axis"] != "report"}


def check(ranks, setup: TrainSetup, plan: Plan) -> tuple[list[dict], dict]:
    """Run ``plan`` on ``ranks`` and hold it to the single process, bytes per axis and every memory
    category (module docstring; none may be left unpredicted). Returns every rank's answer and the
    parity figures."""
    plan.check(setup)
    answers = ranks.run(train_hybrid, setup, plan)
    single, floor = hybrid_moe.reference(setup, plan)  # cached per setup (and m, dp for an MoE model)
    parity = compare(merge(answers, plan.dims.tp), single)
    assert_parity(parity, setup, f"{plan.dims} {plan.schedule}", floor=floor)
    for row in comm_table(answers, setup, plan):
        assert row["measured"] == pytest.approx(row["predicted"], rel=1e-12), row["rank"]
        predicted, measured = row["memory"]["predicted"], row["memory"]["measured"]
        assert predicted == {k: measured[k] for k in predicted}, row["rank"]  # every category, to the byte
    if setup.config().tie_embeddings:  # the copies of the tied weight, per tp index: equal on every rank
        copies: dict = {}
        for a in answers:
            if "tok_emb.weight" in a["result"].params:  # the first and the last stage (one rank on the V)
                copies.setdefault(a["coords"]["tp"], []).append(a["result"].params["tok_emb.weight"])
        assert all(torch.equal(same[0], c) for same in copies.values() for c in same[1:])
    return answers, parity
