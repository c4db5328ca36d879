"""theory.checkpoint.reads: what each loading rank asks for and reads (no torch run). The real-rank
check that DCP's load reads exactly this is tests/parallel/checkpoint/test_reshard.py."""

from playbook.config import ModelConfig
from playbook.dims import ParallelDims as D
from playbook.theory.checkpoint.reads import read_bytes
from playbook.theory.checkpoint.writes import FP32, MOMENTS

TINY = ModelConfig.preset("gpt-tiny")


def lay(dims, zero=0):
    return {"dims": dims, "zero": zero, "schedule": "1f1b", "v": 1}


def _params(cfg) -> int:
    h, d, f, V = cfg.hidden, cfg.dim_head, cfg.ffn_hidden, cfg.vocab_size
    block = 2 * h + h * d * (2 * cfg.n_heads + 2 * cfg.kv_heads) + 3 * h * f
    return cfg.n_layers * block + h + V * h * (1 if cfg.tie_embeddings else 2)


def test_one_rank_reads_the_whole_checkpoint_once_whatever_layout_saved_it():
    tensors = FP32 * (1 + MOMENTS) * _params(TINY)  # counted by hand from the config, not from holdings
    for saved in (lay(D(dp=2)), lay(D(tp=2), 0), lay(D(dp=2, pp=2), 3), lay(D(dp=4), 2)):
        (row,) = read_bytes(TINY, saved, lay(D()))
        small = row["asked"] - tensors
        assert row["read"] == row["asked"] and 0 < small < 10_000, (saved, row)


def test_a_finer_layout_reads_whole_chunks_and_a_cut_one_reads_more_than_it_keeps():
    # tp4 shards lie inside tp2's: each tp2 rank reads exactly what it keeps
    assert all(r["read"] == r["asked"] for r in read_bytes(TINY, lay(D(tp=4)), lay(D(tp=2))))
    # dp2 ZeRO-3 slices cut across tp2's row blocks: a tp2 rank loads chunks it keeps only in part
    rows = read_bytes(TINY, lay(D(dp=2), 3), lay(D(tp=2)))
    assert all(r["read"] > r["asked"] for r in rows)


def test_the_same_layout_reads_its_own_chunks_whole():
    for dims, zero in ((D(dp=2), 3), (D(tp=2, pp=2), 0), (D(dp=2, tp=2), 1)):
        rows = read_bytes(TINY, lay(dims, zero), lay(dims, zero))
        assert all(r["read"] == r["asked"] for r in rows), (dims, zero)
