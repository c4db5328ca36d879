"""What quantization costs in accuracy: logit error and top-1 agreement against full precision, on a trace.

Two measures, both against the fp32 model with an fp32 cache serving the same requests:

- **teacher-forced** (the clean one): the quantized model reads the *reference's* tokens (prompt,
  then each token the reference generated, one decode step at a time through its own paged cache of
  ``kv_dtype``), and its logits at every generated position are compared with the reference's:
  max and mean |Δlogit|, the relative error ‖Δ‖/‖logits‖, and top-1 agreement (the share of
  positions where both argmaxes agree), as quantization papers report next-token agreement
  (e.g. SmoothQuant, Xiao et al. 2023, arXiv:2211.10438, compare accuracy; here: argmax agreement);
- **free-running**: both serve the trace greedily on their own; a request is identical when every
  generated token is, and once one token differs the rest of that request follows another text.

The reference's top-1 margin (top-1 minus top-2 logit) is reported beside the error: a position
flips when the error reaches its margin. With *random* weights (gpt-tiny, untrained) the margins are
whatever the initialisation gives, not a trained model's; the agreement measured here is that of
this noise against those margins, not a prediction for a trained model.
"""

from __future__ import annotations

import torch

from playbook.serve.batching import ContinuousBatcher
from playbook.serve.kv_quant import make_cache
from playbook.serve.packed import forward_packed


def _teacher_forced(model, requests, tokens: dict, kv_dtype: str, block_size: int) -> dict[int, torch.Tensor]:
    """Logits [new, V] of ``model`` at each position where the reference generated, fed the reference's tokens."""
    attn = model.blocks[0].attn
    need = sum(-(-(len(r.prompt) + r.max_new) // block_size) for r in requests)
    cache = make_cache(
        kv_dtype,
        n_layers=len(model.blocks),
        kv_heads=attn.kv_heads,
        head_dim=attn.head_dim,
        n_blocks=need,
        block_size=block_size,
    )
    out: dict[int, list] = {r.id: [] for r in requests}
    chunks = {r.id: list(r.prompt) for r in requests}
    for r in requests:
        cache.add(r.id)
    with torch.no_grad():
        for step in range(max(r.max_new for r in requests)):
            ids = [r.id for r in requests if step < r.max_new]
            starts = [cache.lengths[i] for i in ids]
            for i in ids:
                cache.reserve(i, len(chunks[i]))

            def store_for(layer, ids=ids, starts=starts):
                def store(row, k, v):  # k, v: [g, s, d] -> every cached token's [g, n, d]
                    cache.write(layer, ids[row], k, v)
                    return cache.read(layer, ids[row], starts[row] + k.shape[1])

                return store

            logits = forward_packed(model, [chunks[i] for i in ids], starts, store_for)  # [n, V]
            for i, row in zip(ids, logits):
                cache.advance(i, len(chunks[i]))
                out[i].append(row)
                chunks[i] = [tokens[i][step]]  # the reference's token, whatever this model would pick
    return {i: torch.stack(rows) for i, rows in out.items()}


def agreement(
    reference,
    quantized,
    requests,
    *,
    kv_dtype: str = "fp32",
    n_blocks: int = 64,
    block_size: int = 4,
    max_batch: int = 4,
    baseline=None,
) -> dict:
    """``quantized`` (and its ``kv_dtype`` cache) against ``reference`` (fp32 weights, fp32 cache) on
    ``requests``: the teacher-forced logit error and top-1 agreement, and free-running identity.
    ``baseline``: the reference's ``BatchRun`` on these requests, when already served (else served here)."""
    kw = dict(n_blocks=n_blocks, block_size=block_size, max_batch=max_batch)
    ref = baseline if baseline is not None else ContinuousBatcher(reference, **kw).run(requests)
    free = ContinuousBatcher(quantized, kv_dtype=kv_dtype, **kw).run(requests)
    forced = _teacher_forced(quantized, requests, ref.tokens, kv_dtype, block_size)
    want = torch.cat([ref.logits[r.id] for r in requests])  # [positions, V]
    got = torch.cat([forced[r.id] for r in requests])  # [positions, V]
    diff = (got - want).abs()
    top2 = want.topk(2, -1).values  # [positions, 2]
    same = [free.tokens[r.id] == ref.tokens[r.id] for r in requests]
    agree = sum(a == b for r in requests for a, b in zip(free.tokens[r.id], ref.tokens[r.id]))
    return {
        "positions": want.shape[0],
        "max_abs_logit_err": float(diff.max()),
        "mean_abs_logit_err": float(diff.mean()),
        "relative_logit_err": float((got - want).norm() / want.norm()),
        "top1_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
        "median_top1_margin": float((top2[:, 0] - top2[:, 1]).median()),
        "requests_identical": sum(same),
        "requests": len(requests),
        "free_running_token_agreement": agree / max(sum(len(ref.tokens[r.id]) for r in requests), 1),
    }
