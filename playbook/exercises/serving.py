"""Exercise 8 — serving: KV-cache capacity for a model and a GPU, by hand.

Per token, every layer caches a key and a value for each KV head (Kwon et al. 2023, "Efficient
Memory Management for Large Language Model Serving with PagedAttention", §3):

    KV bytes per token per GPU = 2 · n_layers · (kv_heads / tp) · head_dim · bytes per value

With grouped-query attention kv_heads < n_heads; tensor parallelism splits the KV heads. The cache
gets what the weights and the activation peak of one forward over a ``context``-token prompt (what
vLLM's profiling run measures; given: ``theory.serving.serving.activation_peak``) leave of the memory
vLLM may use (``gpu_memory_utilization`` = 0.9 of what the device reports, ``hw.capacity_bytes``), in
blocks of 16 tokens, and a sequence of ``context`` tokens holds ceil(context/16) blocks:

    budget = 0.9 · capacity − 2 · params / tp − activations;   max_seqs = ⌊budget / block bytes⌋ // ceil(context/16)

Write ``capacity(cfg, hw, context, tp) -> (kv_bytes_per_token, max_seqs)`` in bf16 (2 bytes).
``check`` compares with ``playbook.theory.serving.serving.kv_capacity`` and with the bytes of a real paged
cache block (``playbook.serve.kv.PagedKVCache``) of the model's shape, allocated and measured.
"""

from __future__ import annotations

import torch

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.exercises._common import NotYetWritten, Verdict
from playbook.serve.kv import PagedKVCache
from playbook.theory.serving import serving
from playbook.theory.serving.serving import kv_capacity

NAME = "serving: KV-cache capacity by hand"
MEM_UTIL = 0.9
CASES = [
    ("llama-3.1-8b", "h100-sxm", 8192, 1),
    ("llama-3.1-70b", "h100-sxm", 32768, 4),
    ("llama-3.1-70b", "h100-sxm", 8192, 16),
]


def solution(cfg: ModelConfig, hw: Hardware, context: int, tp: int) -> tuple[float, int]:
    """The reference answer."""
    mem_util, block_size = 0.9, 16  # vLLM's gpu_memory_utilization and tokens per KV block
    kv_heads = max(cfg.kv_heads // tp, 1)  # tp > kv_heads: each rank keeps a copy of one KV head
    per_token = 2 * cfg.n_layers * kv_heads * cfg.dim_head * 2  # K and V, bf16
    activations = serving.activation_peak(cfg, tokens=context, tp=tp)  # vLLM's profiling run, predicted
    budget = mem_util * hw.capacity_bytes - 2 * cfg.num_params() / tp - activations  # what is left
    blocks = int(budget // (block_size * per_token))
    return per_token, blocks // -(-context // block_size)  # whole blocks per sequence


def measured_bytes_per_token(cfg: ModelConfig, tp: int) -> float:
    """One block of a real paged cache of this model's shape on one GPU, allocated in bf16."""
    cache = PagedKVCache(
        n_layers=cfg.n_layers,
        kv_heads=max(cfg.kv_heads // tp, 1),
        head_dim=cfg.dim_head,
        n_blocks=1,
        dtype=torch.bfloat16,
    )
    return cache.block_bytes / cache.block_size


def _per_token_problem(mine: float, ref: float, cfg: ModelConfig, tp: int) -> str:
    ratio = mine / ref
    near = lambda x: abs(ratio - x) < 1e-9 * max(1, x)  # noqa: E731
    if near(0.5):
        return "half the right value: every layer caches a key AND a value per KV head (the factor 2)"
    if cfg.n_heads != cfg.kv_heads and near(cfg.n_heads / cfg.kv_heads):
        return (
            f"{ratio:g}× too large: {cfg.name} uses grouped-query attention — the cache holds its "
            f"{cfg.kv_heads} KV heads, not its {cfg.n_heads} query heads"
        )
    if tp > 1 and near(tp):
        return f"{tp}× too large: tensor parallelism splits the KV heads, so each GPU caches kv_heads/tp = {max(cfg.kv_heads // tp, 1)}"
    if near(2):
        return "2× too large: bf16 is 2 bytes per value"
    return f"{ratio:.3g}× the right value"


def _max_seqs_problem(mine: int, ref: dict, cfg: ModelConfig, hw: Hardware, context: int, tp: int) -> str:
    per_seq = ref["block_bytes"] * ref["blocks_per_seq"]
    weights, act, memory = 2 * cfg.num_params() / tp, ref["activations"], MEM_UTIL * hw.capacity_bytes
    guesses = {
        "you gave the cache all of the memory: vLLM keeps 10% back (gpu_memory_utilization 0.9)": (
            hw.capacity_bytes - weights - act
        ),
        "the weights live in the same memory: subtract them before filling it with cache": memory - act,
        f"each GPU holds 1/tp = 1/{tp} of the weights": memory - 2 * cfg.num_params() - act,
        "the activations of vLLM's profiling run come out of the same 0.9: subtract "
        "serving.activation_peak(cfg, tokens=context, tp=tp)": memory - weights,
        "0.9 is of the memory the device reports (hw.capacity_bytes), not the datasheet's hw.memory_bytes": (
            MEM_UTIL * hw.memory_bytes - weights - act
        ),
    }
    for why, budget in guesses.items():
        if int(max(budget, 0) // ref["block_bytes"]) // ref["blocks_per_seq"] == mine:
            return why
    return f"the KV budget is {ref['kv_budget'] / 1e9:.1f} GB and one sequence takes {per_seq / 1e9:.3g} GB"


def check(fn) -> Verdict:
    """Compare ``fn(cfg, hw, context, tp)`` with the theory and a measured cache block."""
    numbers = {}
    for model, gpu, context, tp in CASES:
        cfg, hw = ModelConfig.preset(model), Hardware.preset(gpu)
        case = f"{model} on {gpu}, context {context}, tp={tp}"
        try:
            mine, seqs = fn(cfg, hw, context, tp)
        except NotYetWritten:
            return Verdict(NAME, False, "not yet written — fill in the cell above, then run the check again")
        except Exception as e:  # noqa: BLE001 - the learner's error, in one line
            return Verdict(NAME, False, f"{case}: capacity(...) raised {type(e).__name__}: {e}")
        ref = kv_capacity(cfg, hw, context=context, tp=tp, mem_util=MEM_UTIL)
        measured = measured_bytes_per_token(cfg, tp)
        if abs(mine - ref["kv_bytes_per_token"]) > 0.5:
            why = _per_token_problem(mine, ref["kv_bytes_per_token"], cfg, tp)
            return Verdict(
                NAME,
                False,
                f"{case}: your KV bytes per token ({mine:,.0f}) is {why}; a real cache block measures {measured:,.0f}",
            )
        if int(seqs) != ref["max_seqs"]:
            why = _max_seqs_problem(int(seqs), ref, cfg, hw, context, tp)
            return Verdict(NAME, False, f"{case}: your max_seqs is {seqs}, predicted {ref['max_seqs']}: {why}")
        numbers[f"{case}: KV bytes/token, yours = predicted"] = float(mine)
        numbers[f"{case}: KV bytes/token, measured on a real bf16 block"] = measured
        numbers[f"{case}: sequences that fit"] = int(seqs)
    return Verdict(NAME, True, "your numbers equal the prediction, and a real cache block measures the same", numbers)
