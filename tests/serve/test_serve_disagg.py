"""Disaggregated prefill and decode on 2 ranks: the decode rank's tokens equal one process without a
cache, and the KV bytes the tracer saw sent equal the paged prediction (whole blocks of each prompt)."""

import torch

from playbook.config import ModelConfig
from playbook.model.gpt import GPT
from playbook.serve.batching import make_requests
from playbook.serve.disagg import disagg_on_rank
from playbook.serve.generate import greedy_without_cache
from playbook.theory.serving.serving import kv_bytes_per_token, paged_kv_bytes

TINY = ModelConfig.preset("gpt-tiny")


def test_prefill_rank_sends_exactly_the_predicted_kv_and_decode_rank_matches(ranks2):
    reqs = make_requests(4, TINY.vocab_size, seed=5)
    prefill, decode = ranks2.run(disagg_on_rank, cfg=TINY, seed=0, requests=reqs, n_blocks=16, block_size=4)
    model = GPT(TINY, seed=0).eval()
    for r in reqs:
        assert decode["tokens"][r.id] == greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new)[0][0].tolist()
    per_token = kv_bytes_per_token(TINY, dtype="fp32")
    assert prefill["kv_bytes_sent"] == paged_kv_bytes([len(r.prompt) for r in reqs], per_token, 4) > 0
    assert prefill["sends"] == 3 * len(reqs) and decode["kv_bytes_sent"] == 0


def test_transfer_against_the_prefill_it_moves_by_hand():
    from playbook.hardware import Hardware
    from playbook.theory.serving.disagg import transfer

    llama70, h100 = ModelConfig.preset("llama-3.1-70b"), Hardware.preset("h100-sxm")
    near = transfer(llama70, h100, prompt=8192, tp=4)
    assert near["kv_bytes_per_rank"] == 8192 * 327_680 / 4  # 512 whole blocks of 16 tokens, a quarter of the heads
    assert near["transfer_seconds"] == near["kv_bytes_per_rank"] / h100.intra_node_bandwidth
    far = transfer(llama70, h100, prompt=8192, tp=4, inter_node=True)
    assert near["transfer_over_prefill"] < far["transfer_over_prefill"]  # the network, not NVLink, decides
