"""The planner against published training runs: each run's layout costed with the same functions as
``playbook plan`` (``plan_layout.cost_layout``) and ranked among the layouts the planner finds for
the same model, GPUs, sequence and batch, searched over what the run's own software stack offered.

**Megatron-LM** (Narayanan et al. 2021, arXiv:2104.04473, Table 1): GPT models with vocabulary
51,200 and sequences of 2,048 on 80 GB A100s (Selene), t-way tensor and p-way pipeline parallelism,
data parallelism over the rest, throughput in achieved teraFLOP/s per GPU counted with their
eq. 3, F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration, which includes the recomputed
forward. Model FLOPs, what MFU counts, leave that forward out: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
(their eq. 3's terms, the transformer's counted three times instead of four, the head's three
times as in eq. 3), PaLM's 6N + 12·l·h·s per token to within the biases and norms. So published
MFU = X / 312 TFLOP/s × model / eq. 3. Their GPT's MLP is GeLU of width 4h (8h² weights); ours is
SwiGLU, so each model is a SwiGLU of width 8·round(h/3) (the same 8h² weights, and the same
saved MLP tensors: h + 4h + 4h per token either way), tied embeddings, multi-head attention.
Assumed where Table 1 is silent: micro-batch 1, the 1F1B schedule, full recomputation (eq. 3
counts it), no ZeRO (Megatron-LM's distributed optimizer came later). Ranked among 1F1B and
interleaved layouts without ZeRO, with or without full recomputation.

**Llama 3** (Dubey et al. 2024, arXiv:2407.21783, Table 4): 405B on 80 GB H100s, BF16 MFU 43 %
(8,192 GPUs), 41 % (16,384) at 8K tokens, 38 % at 128K; TP8·PP16 with DP64 / DP128, and
TP8·CP16·PP16 at 128K, where the table prints DP4 but 16,384 / (8·16·16) = 8 GPUs are left for
data parallelism, and 16 sequences per DP rank of 131,072 tokens make the published 16M-token batch
only with DP8: we cost DP8. The pipeline as §3.3.2 describes it (``ends=light``, v = 8: chunks of
one layer, the embedding and the loss alone on the end chunks), no recomputation (§3.3.2: trained
"without activation checkpointing" at 8K), FSDP sharding gradients and optimizer state (zero=2, our
reading). Ranked among every layout the planner searches but the zero-bubble schedules.

Left out, plainly: attention's kernel efficiency by shape (at 128K it is over half the FLOPs), the
allocator and communication buffers (the 10 % the planner keeps free), stragglers, the optimizer
step, data loading; and the schedules' exact orders beyond Megatron-LM's (Llama 3's own schedule
sets how many micro-batches run per chunk, its Figure 6; not published for the 405B run); and how
Llama 3 counts attention's FLOPs (not stated: PaLM's both [T, T] products, or a causal kernel's half,
which at 128K changes the published MFU in PaLM's count by 1.4×).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playbook.config import Hardware, ModelConfig
from playbook.theory.plan_layout import cost_layout, parse_layout
from playbook.theory.planner import plan

A100_PEAK_2021 = 312e12  # Narayanan et al. 2021, §5: "the peak device throughput of an A100 GPU with 16-bit precision"
MEGATRON_V, MEGATRON_S = 51_200, 2_048
# Table 1: (parameters in billions, attention heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU)
MEGATRON_TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
MEGATRON_STACK = dict(schedules=("1f1b", "interleaved"), zeros=(0,), recomputes=("none", "full"))
# Table 4: (GPUs, layout, seq_len, sequences per step, published BF16 MFU)
LLAMA3_TABLE_4 = (
    (8192, "dp=64 tp=8 pp=16", 8192, 64 * 32, 0.43),
    (16384, "dp=128 tp=8 pp=16", 8192, 128 * 16, 0.41),
    (16384, "dp=8 tp=8 pp=16 cp=16", 131072, 8 * 16, 0.38),
)
LLAMA3_AS_RUN = "zero=2 recompute=none schedule=interleaved v=8 ends=light"
LLAMA3_STACK = dict(schedules=("1f1b", "interleaved"))


@dataclass(frozen=True)
class PublishedRun:
    run: str  # how the table names it
    cfg: ModelConfig
    hardware: str
    layout: str  # parse_layout's text, our assumptions included
    seq_len: int
    global_batch: int
    published: str  # what the paper prints
    published_mfu: float
    stack: dict = field(default_factory=dict)  # plan()'s options: what the run's software offered


def megatron_model_share(h: int, layers: int, s: int = MEGATRON_S, vocab: int = MEGATRON_V) -> float:
    """Model FLOPs over eq. 3's (which counts the recomputed forward): module docstring."""
    return (72 * (1 + s / (6 * h)) + 6 * vocab / (layers * h)) / (96 * (1 + s / (6 * h)) + 6 * vocab / (layers * h))


def megatron_runs() -> list[PublishedRun]:
    out = []
    for billions, heads, h, layers, t, p, gpus, batch, tflops in MEGATRON_TABLE_1:
        cfg = ModelConfig(
            name=f"megatron-gpt-{billions:g}b",
            vocab_size=MEGATRON_V,
            hidden=h,
            n_layers=layers,
            n_heads=heads,
            ffn_hidden=8 * round(h / 3),
            max_seq_len=MEGATRON_S,
            tie_embeddings=True,
        )
        mfu = tflops * 1e12 / A100_PEAK_2021 * megatron_model_share(h, layers)
        layout = f"dp={gpus // (t * p)} tp={t} pp={p} zero=0 b=1 recompute=full"
        text = f"{tflops} TFLOP/s per GPU (eq. 3)"
        out.append(
            PublishedRun(f"{billions:g}B, {gpus:,} A100s", cfg, "a100-80gb", layout, MEGATRON_S, batch, text, mfu)
        )
    return [PublishedRun(**{**r.__dict__, "stack": MEGATRON_STACK}) for r in out]


def llama3_runs() -> list[PublishedRun]:
    cfg = ModelConfig.preset("llama-3.1-405b")
    return [
        PublishedRun(
            f"405B, {gpus:,} H100s, seq {seq:,}",
            cfg,
            "h100-sxm",
            f"{text} {LLAMA3_AS_RUN}",
            seq,
            batch,
            f"{mfu:.0%} BF16 MFU",
            mfu,
            LLAMA3_STACK,
        )
        for gpus, text, seq, batch, mfu in LLAMA3_TABLE_4
    ]


def validate(run: PublishedRun, *, rank: bool = True) -> dict:
    """One row: the published layout's predicted MFU and memory, whether it fits (90 % of the
    device's reported memory, ``planner.MEM_UTIL``), and two ranks among the layouts the planner
    finds over ``run.stack``: the layout as run (1 + the candidates faster than it) and its degrees
    (the planner's best variant of the same dp, tp, pp, cp: micro-batch, schedule, ZeRO, recomputation)."""
    hw = Hardware.preset(run.hardware)
    lay = parse_layout(run.layout, global_batch=run.global_batch)
    r = cost_layout(run.cfg, hw, lay, seq_len=run.seq_len, rank=False)
    row = {
        "run": run.run,
        "layout": r["layout"],
        "published": run.published,
        "published_mfu": run.published_mfu,
        "predicted_mfu": r["mfu"],
        "ratio": r["mfu"] / run.published_mfu,
        "memory": r["memory_total"],
        "fits": r["fits"],
        "margin": r["margin_bytes"],
    }
    if rank:
        gpus = lay.dp * lay.tp * lay.pp * lay.cp
        p = plan(run.cfg, hw, gpus=gpus, seq_len=run.seq_len, global_batch=run.global_batch, **run.stack)
        step = r["step"]["total"]
        degrees = lay.degrees
        same = [i for i, c in enumerate(p.candidates) if c.layout.degrees == degrees]
        row |= {
            "rank_as_run": 1 + sum(c.cost.total < step for c in p.candidates),
            "rank_of_degrees": same[0] + 1 if same else None,
            "of": len(p.candidates),
        }
    return row
