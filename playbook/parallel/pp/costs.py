"""What each piece of the GPT costs alone: the embedding, every block, the head with the loss, timed
forward and backward on one micro-batch in this process, with the activation bytes it saves. Stages
balanced by these costs (``theory.pp.layer_partition.balanced_partition``) are closer to equal than
equal layer counts: Narayanan et al. 2021 (arXiv:2104.04473) §2.2 assume equal stages, and a real
model's embedding and head are not.
"""

from __future__ import annotations

import time

import torch

from playbook.model.gpt import GPT, lm_loss
from playbook.parallel.pp.executor import Chunk
from playbook.theory.pp.pipeline import chunk_activation_bytes


def piece_costs(setup, micro_batch: int, repeats: int = 5) -> dict[str, list[float]]:
    """Measure each piece (embedding, every block, head + loss) alone in this process: median
    forward and backward seconds for one micro-batch (the fastest of ``repeats`` after a warm-up, on
    one thread like a rank: the least disturbed by other work on the machine), and the exact
    activation bytes it saves. Feed ``f + b`` (time) or ``bytes`` (memory) to ``balanced_partition``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _piece_costs(setup, micro_batch, repeats)
    finally:
        torch.set_num_threads(threads)


def _piece_costs(setup, micro_batch: int, repeats: int) -> dict[str, list[float]]:
    cfg = setup.config()
    model = GPT(cfg, seed=setup.seed)
    tokens, targets = setup.task().batch(0, micro_batch, setup.seq_len)  # [micro_batch, s]
    out = {"f": [], "b": [], "bytes": []}
    for i in range(cfg.n_layers + 2):
        chunk = Chunk(model, i, i + 1, global_tokens=micro_batch * setup.seq_len)
        fs, bs = [], []
        for _ in range(repeats + 1):
            x = tokens if i == 0 else torch.randn(micro_batch, setup.seq_len, cfg.hidden, requires_grad=True)
            t0 = time.perf_counter()
            y = chunk(x)  # [b, s, hidden] or [b, s, vocab]
            y = lm_loss(y, targets) if chunk.last else y
            t1 = time.perf_counter()
            y.backward(None if chunk.last else torch.ones_like(y))
            t2 = time.perf_counter()
            fs.append(t1 - t0)
            bs.append(t2 - t1)
        out["f"].append(min(fs[1:]))
        out["b"].append(min(bs[1:]))
        out["bytes"].append(chunk_activation_bytes(cfg, i, i + 1, micro_batch, setup.seq_len))
    model.zero_grad(set_to_none=True)
    return out
