"""What a tensor-parallel degree may be, and the weights one rank of it holds (Shoeybi et al. 2019,
*Megatron-LM*, arXiv:1909.08053, §3): q/k/v, gate/up and the head split by output channels, o and
down by input channels, the embedding by vocabulary rows; the RMSNorm weights replicated. The
lowest layer of ``theory.tp.tp`` (which re-exports it), read by ``theory.tp.comm`` too. No torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig, divisors, require_positive


# ---- what t may be -----------------------------------------------------------------------------
def valid_tp(cfg: ModelConfig) -> list[int]:
    """Degrees that split every sharded dimension evenly: divisors of heads, KV heads, ffn and vocab."""
    return [t for t in divisors(cfg.n_heads) if all(n % t == 0 for n in _split_sizes(cfg).values())]


def _split_sizes(cfg: ModelConfig) -> dict[str, int]:
    return {
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.kv_heads,
        "ffn_hidden": cfg.ffn_hidden,
        "vocab_size": cfg.vocab_size,
    }


def check_tp(
    cfg: ModelConfig, tp: int, *, seq_len: int | None = None, sequence_parallel: bool = False, regather: bool = False
) -> None:
    """Raise ``ValueError`` unless ``tp`` splits heads, KV heads (no replicated KV heads here), ffn and
    vocabulary evenly, and (with sequence parallelism) the sequence; the message lists valid values."""
    require_positive(tp=tp)
    if regather and not sequence_parallel:
        raise ValueError("regather saves sequence shards, so it needs sequence_parallel=True")
    for name, size in _split_sizes(cfg).items():
        if size % tp:
            valid = ", ".join(map(str, valid_tp(cfg)))
            raise ValueError(f"tp={tp} does not divide {name}={size}; try tp in {{{valid}}}")
    if sequence_parallel and seq_len is not None and seq_len % tp:
        raise ValueError(
            f"sequence parallelism splits the sequence: tp={tp} does not divide seq_len={seq_len}; "
            f"use a seq_len that is a multiple of {tp}, or tp in {{{', '.join(map(str, divisors(seq_len)))}}}"
        )


# ---- weights -----------------------------------------------------------------------------------
def params_per_rank(cfg: ModelConfig, tp: int) -> dict[str, int]:
    """Parameters one rank holds: ``split`` (1/t of every sharded matrix) and ``replicated`` (norms).
    ``split + replicated`` with tp=1 is ``cfg.num_params()``."""
    check_tp(cfg, tp)
    replicated = (2 * cfg.n_layers + 1) * cfg.hidden
    return {"split": (cfg.num_params() - replicated) // tp, "replicated": replicated}


def matrix_shards(cfg: ModelConfig, tp: int) -> list[dict]:
    """Every weight of one layer and around the layers: its full shape [out, in], how it is split
    (``"rows"``: by output channel / vocabulary row, ``"cols"``: by input channel, ``None``:
    replicated) and the shape one rank holds. The data behind the shard diagram."""
    check_tp(cfg, tp)
    h, a, g, d, f, V = cfg.hidden, cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.ffn_hidden, cfg.vocab_size
    mats = [
        ("tok_emb", (V, h), "rows", "vocabulary rows"),
        ("q_proj", (a * d, h), "rows", "query heads"),
        ("k_proj", (g * d, h), "rows", "key/value heads"),
        ("v_proj", (g * d, h), "rows", "key/value heads"),
        ("o_proj", (h, a * d), "cols", "query heads"),
        ("gate_proj", (f, h), "rows", "ffn channels"),
        ("up_proj", (f, h), "rows", "ffn channels"),
        ("down_proj", (h, f), "cols", "ffn channels"),
        ("lm_head", (V, h), "rows", "vocabulary rows"),
        ("norms", (2 * cfg.n_layers + 1, h), None, "replicated"),
    ]
    out = []
    for name, (rows, cols), split, by in mats:
        local = (rows // tp, cols) if split == "rows" else (rows, cols // tp) if split == "cols" else (rows, cols)
        out.append({"name": name, "shape": (rows, cols), "split": split, "by": by, "local": local})
    return out
