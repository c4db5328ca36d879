"""The bytes of weights one tensor-parallel rank of a dense GQA model holds, to the byte, with its
linears quantized or not (pure arithmetic, no torch).

Weight quantization with per-output-channel scales: every linear of every block (q, k, v, o; gate,
up, down) stores one byte per weight and one fp32 scale per output channel, ``w ≈ s_o · q[o, i]``
(INT8: LLM.int8(), Dettmers et al. 2022, arXiv:2208.07339, §3.1 "vector-wise quantization"; FP8
e4m3: Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv:2209.05433, §3). The
embedding, the output head and the norms stay at the base dtype, as vLLM's FP8 checkpoints leave
them (``playbook.serve.quant`` does the same to our GPT).

Under Megatron TP (Shoeybi et al. 2019) a column-parallel layer (q, k, v, gate, up) holds out/t
rows and their out/t scales; a row-parallel one (o, down) holds in/t columns of *every* output row,
so every rank keeps all ``hidden`` scales of o and down (replicated); the vocabulary splits the
embedding and the head by rows; the norms are replicated.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.theory.inventory.model_state import _dtype_bytes

WEIGHT_SCALE_BYTES = 4  # one fp32 scale per output channel of a quantized linear
QUANTIZE = ("int8", "fp8")  # the weight formats ``serve.quant`` implements


def block_linears(cfg: ModelConfig) -> dict[str, tuple[int, int, int]]:
    """Each linear of one block: name -> (out features, in features, the dim TP splits: 0 rows, 1 columns)."""
    a, g, d, h, f = cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.hidden, cfg.ffn_hidden
    return {
        "q_proj": (a * d, h, 0),
        "k_proj": (g * d, h, 0),
        "v_proj": (g * d, h, 0),
        "o_proj": (h, a * d, 1),
        "gate_proj": (f, h, 0),
        "up_proj": (f, h, 0),
        "down_proj": (h, f, 1),
    }


def served_weight_bytes(cfg: ModelConfig, *, tp: int = 1, quantize: str | None = None, dtype: str = "fp32") -> dict:
    """Bytes of weights on one of ``tp`` ranks: ``linears`` (the blocks' linears, 1 byte each when
    ``quantize`` is "int8" or "fp8", else ``dtype``), ``scales`` (their fp32 per-output-channel
    scales: out/t per column layer, out per row layer), ``other`` (embedding and head split by
    vocabulary, norms replicated, at ``dtype``) and ``total``. Dense grouped-query models only."""
    if cfg.is_moe or cfg.attention != "gqa" or cfg.qkv_bias:
        raise ValueError(
            f"{cfg.name}: quantized weights are counted for dense GQA models without biases (gpt-tiny, gpt-small, "
            f"Llama); MoE and MLA layouts are not, try --model gpt-tiny"
        )
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)} or None, got {quantize!r}")
    if tp < 1 or any(n % tp for n in (cfg.n_heads, cfg.kv_heads, cfg.ffn_hidden, cfg.vocab_size)):
        raise ValueError(f"tp={tp} must divide heads, KV heads, ffn and vocabulary of {cfg.name}")
    b = _dtype_bytes(dtype)
    wb = 1 if quantize else b
    linears = scales = 0.0
    for out, inp, dim in block_linears(cfg).values():
        linears += out * inp / tp * wb
        scales += (out / tp if dim == 0 else out) * WEIGHT_SCALE_BYTES if quantize else 0
    linears, scales = linears * cfg.n_layers, scales * cfg.n_layers
    vocab = cfg.vocab_size * cfg.hidden / tp * (1 if cfg.tie_embeddings else 2)
    other = (vocab + (2 * cfg.n_layers + 1) * cfg.hidden) * b
    return {"linears": linears, "scales": scales, "other": other, "total": linears + scales + other}
