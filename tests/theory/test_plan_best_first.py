"""The planner's best-first search (``theory.plan.best_first``) against the sort of every variant it
replaced (``plan(exhaustive=True)``), and the micro-batches and chunk counts the search reaches."""

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.planner import plan
from playbook.theory.plan.schedule import schedule_options
from playbook.theory.plan.search import MAX_MICRO_BATCH

H100 = Hardware.preset("h100-sxm")


def _record(p):
    cands = [(str(c.layout), c.cost, c.memory, c.mfu, c.tokens_per_s) for c in p.candidates]
    return cands, p.dominated, p.rejected, p.smallest


@pytest.mark.parametrize(
    "name, gpus, seq, batch, kw",
    [
        ("mixtral-8x7b", 32, 4096, 128, {}),  # MoE: every ep, pipelines, ZeRO stages
        ("llama-3.1-70b", 64, 8192, 128, dict(overlap="none")),  # dense, every schedule, dp exposed
        ("llama-3.1-8b", 16, 8192, 64, dict(precision="fp8", schedules=("zb-v", "interleaved", "1f1b"))),
        ("gpt-tiny", 8, 64, 64, dict(activations="ours", attention="eager")),  # pp = 1 and our kernels
    ],
)
def test_best_first_finds_what_sorting_every_variant_finds(name, gpus, seq, batch, kw):
    """The same candidates (layout, every cost term, memory), the same counts of slower variants and of
    rejections by reason with the same first messages, the same smallest rejected layout."""
    cfg = ModelConfig.preset(name)
    fast, every = (
        plan(cfg, H100, gpus=gpus, seq_len=seq, global_batch=batch, exhaustive=e, **kw) for e in (False, True)
    )
    assert len(fast.candidates) > 3
    assert _record(fast) == _record(every)


def test_the_search_reaches_published_micro_batches_and_chunks():
    """Published runs used micro-batches of 16 and 12 chunks per stage (issue 41): the search tries
    them, and a small model's GEMMs, fastest at the largest micro-batch, pick b = 16."""
    assert MAX_MICRO_BATCH >= 16
    assert ("interleaved", 12) in schedule_options(8, 64, n_layers=96)
    p = plan(ModelConfig.preset("gpt-tiny"), H100, gpus=8, seq_len=64, global_batch=256)
    assert p.candidates[0].layout.micro_batch == 16


def test_deepseek_v3_plans_the_same_without_the_memory_memos(monkeypatch):
    """The memoised pieces of ``theory.plan.memory`` a MoE search leans on (a rank's chunk parameters,
    its ZeRO state, a structure's refusal, a pipeline's per-rank states) replaced by the functions they
    wrap, uncached: DeepSeek-V3's plan on 256 GPUs is the same, the top 20 (layout and every cost
    term, by repr) and every count. A memo keyed on too little (an ep or ZeRO stage left out) goes red."""
    from playbook.theory.plan import memory

    cfg, sizes = ModelConfig.preset("deepseek-v3"), dict(gpus=256, seq_len=4096, global_batch=1024)
    cached = plan(cfg, H100, **sizes)
    for name in ("_chunk_params", "_state", "_refusal_at", "_pipeline_states", "rank_state"):
        monkeypatch.setattr(memory, name, getattr(memory, name).__wrapped__)
    fresh = plan(cfg, H100, **sizes)
    assert len(cached.candidates) >= 20
    top = [[(repr(c.layout), repr(c.cost), c.memory) for c in p.candidates[:20]] for p in (cached, fresh)]
    assert top[0] == top[1]
    assert _record(cached) == _record(fresh)
