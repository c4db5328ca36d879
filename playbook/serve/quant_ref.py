"""The one-process reference of a quantized serving run, and its bytes against the prediction.

``playbook run serve --quantize int8 --kv-dtype int8`` cannot be checked against the fp32 model:
quantization changes the logits (that cost is ``serve.accuracy``'s). Its parity gate is one process
running the *same* quantized model (``serve.quant.quantize_model`` of the seeded reference) with the
same cache (``serve.kv_quant``), serving each replica's requests with that replica's schedule: then
the TP ranks must generate the same tokens, their logits equal up to the order of TP's partial sums:
within 1e-5 with an fp32 cache; with a rounded cache (16- or 8-bit) within :data:`ROUNDED_KV_TOLERANCE`,
since TP's last-bit differences (~1e-7) can put a K or V value on the other side of a rounding
boundary of the cache's format, moving it by one step of that format (measured: up to 1.4e-4 on
gpt-small, tp2 × dp2, 12 requests, int8 weights and KV; the tokens stay identical).
Bytes: each rank's weights (``serve.quant.weight_bytes``) against
``theory.serving.weights.served_weight_bytes``, its KV block against ``serving.kv_block_bytes``.
"""

from __future__ import annotations

import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.serve.batching import ContinuousBatcher
from playbook.serve.quant import quantize_model
from playbook.serve.report import LOGIT_TOLERANCE
from playbook.theory.serving.serving import kv_block_bytes
from playbook.theory.serving.weights import served_weight_bytes


ROUNDED_KV_TOLERANCE = 1e-3  # max |logit diff| against one process when the cache rounds (see above)


def logit_tolerance(kv_dtype: str) -> float:
    return LOGIT_TOLERANCE if kv_dtype == "fp32" else ROUNDED_KV_TOLERANCE


def is_quantized(quantize: str | None, kv_dtype: str) -> bool:
    return quantize is not None or kv_dtype != "fp32"


def reference(
    cfg: ModelConfig, seed: int, requests, *, assign, dp: int, quantize, kv_dtype, **batcher
) -> dict[int, tuple[list[int], torch.Tensor]]:
    """Tokens and logits of every request from one process: the quantized model, each replica's
    requests (``assign``) served by a ``ContinuousBatcher`` with the run's options (``batcher``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = GPT(cfg, seed=seed).eval()
        if quantize:
            model = quantize_model(model, quantize)
        out = {}
        for d in range(dp):
            mine = [r for r in requests if assign[r.id] == d]
            run = ContinuousBatcher(model, kv_dtype=kv_dtype, **batcher).run(mine)
            out |= {r.id: (run.tokens[r.id], run.logits[r.id]) for r in mine}
        return out
    finally:
        torch.set_num_threads(threads)


def bytes_parity(answers: list[dict], cfg: ModelConfig, dims: ParallelDims, *, quantize, kv_dtype, block_size) -> dict:
    """Weight bytes and KV block bytes of every rank, measured, beside the prediction."""
    weights = served_weight_bytes(cfg, tp=dims.tp, quantize=quantize, dtype="fp32")["total"]
    block = kv_block_bytes(cfg, tp=dims.tp, dtype=kv_dtype, block_size=block_size)
    measured_w = [a["weight_bytes"]["total"] for a in answers]
    measured_b = [a["block_bytes"] for a in answers]
    return {
        "weight_bytes": {"predicted": weights, "measured": measured_w},
        "kv_block_bytes": {"predicted": block, "measured": measured_b},
        "bytes_match": all(w == weights for w in measured_w) and all(b == block for b in measured_b),
        "logit_tolerance": logit_tolerance(kv_dtype),
    }
