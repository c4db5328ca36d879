"""The planner calibrated on two published tables: each run's layout costed with the same functions as
``playbook plan`` (``theory.plan.layout.cost_layout``) and ranked among the layouts the planner finds for
the same model, GPUs, sequence and batch, searched over what the run's own software stack offered.

A calibration, not a test: three choices below were made where the alternative misses, and each run
names them (``PublishedRun.fitted``; ``theory.plan.fitted`` gives the ratio each alternative gives).
Megatron-LM's overlap, "none"; its micro-batch and chunks, the planner's own fastest; Llama 3's
attention count, causal. Other published runs are the test, and none is costed here yet.

**Megatron-LM** (Narayanan et al. 2021, arXiv:2104.04473, Table 1): GPT models with vocabulary
51,200 and sequences of 2,048 on 80 GB A100s (Selene), t-way tensor and p-way pipeline parallelism,
data parallelism over the rest, throughput in achieved teraFLOP/s per GPU counted with their
eq. 3, F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration, which "assumes activation
recomputation and takes into account the floating-point operations associated with the extra
forward pass" (§5.1). Model FLOPs, what MFU counts, leave that forward out: 72·B·s·l·h²·(1 + s/(6h)
+ V/(12·l·h)) (their eq. 3's terms, the transformer's counted three times instead of four, the
head's three times as in eq. 3), PaLM's 6N + 12·l·h·s per token to within the biases and norms. So
published MFU = X / 312 TFLOP/s × model / eq. 3. Their GPT's MLP is GeLU of width 4h (8h² weights);
ours is SwiGLU, so each model is a SwiGLU of width 8·round(h/3) (the same 8h² weights, and the same
saved MLP tensors: h + 4h + 4h per token either way), tied embeddings, multi-head attention. As
§5.1 states: "the interleaved pipeline schedule with the scatter/gather optimization enabled", and
full recomputation (eq. 3 counts it); its communication, fitted, none of it overlapped
(``overlap="none"``: the local DDP all-reduced the gradients after the last backward).
Where the paper is silent the planner chooses, fitted too, as it would for its own layouts: the micro-batch
(Table 1 does not print it; §5.5 finds 2 best for one 91B model and calls the best
"model-dependent") among 1, 2, 4, 8, and the chunks per stage v among those that give each chunk the
same whole number of layers, the fastest pair that fits (:func:`megatron_unprinted`); no ZeRO
(Megatron-LM's distributed optimizer came later). Ranked among 1F1B and interleaved layouts
without ZeRO.

**Llama 3** (Dubey et al. 2024, arXiv:2407.21783, Table 4): 405B on 80 GB H100s, BF16 MFU 43 %
(8,192 GPUs), 41 % (16,384) at 8K tokens, 38 % at 128K; TP8·PP16 with DP64 / DP128, and
TP8·CP16·PP16 at 128K, where the table prints DP4 but 16,384 / (8·16·16) = 8 GPUs are left for
data parallelism, and 16 sequences per DP rank of 131,072 tokens make the published 16M-token batch
only with DP8: we cost DP8. The pipeline as §3.3.2 describes it (``ends=light``, v = 8: chunks of
one layer, the embedding and the loss alone on the end chunks), no recomputation (§3.3.2: trained
"without activation checkpointing" at 8K; not stated for 128K), FSDP sharding gradients and
optimizer state (zero=2, our reading). Ranked among every layout the planner searches but the
zero-bubble schedules.

The micro-batches per chunk. Llama 3 makes N, "the number of contiguous micro-batches for the same
stage's forward or backward", tunable (§3.3.2, Figure 6), as Megatron-LM's
``microbatch_group_size_per_vp_stage`` does; Megatron-LM accepts N in [p, m] and starts rank r with
2(p − r − 1) + (v − 1)·N forwards (``megatron/core/pipeline_parallel/schedules.py``,
``get_pp_rank_microbatches``; PyTorch's ``ScheduleInterleaved1F1B`` the same with N = p when p
divides m). N = p, what the planner plays, is the least memory; a larger N "hides point-to-point
communication" (§3.3.2) at more. Llama 3 does not print its N.

Llama 3 defines its MFU by citing PaLM (§3.3.2: "MFU; Chowdhery et al. (2023)"), whose 12·L·H·Q·T
counts both [T, T] products whole (Chowdhery et al. 2022, Appendix B; what ``theory.cost.flops`` and this planner count, and
torchtitan's convention: "we follow the convention and do not account for sparsity in causal
attention", ``torchtitan/models/utils.py``); a causal count keeps half. Each row carries both
readings of the published number (``published_mfu_causal``: the published MFU in PaLM's count had
Llama 3 counted the causal half); at 8K they differ by a few percent, at 128K by 1.4×. The causal
reading is fitted, against the citation, on the 128K row (:func:`implied_attention_utilization`): take the planner's
time for all but attention and give attention whatever is left of the published step; a causal
kernel (FlashAttention skips the masked half) then ran at 18 % of the H100's peak if 38 % is PaLM's
count, at 36 % if it is a causal count. FlashAttention-2, what 2024 ran on H100s, reaches 35 %
(Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, abstract: "only 35% utilization on the H100
GPU"). So Llama 3's rows are compared in a causal count (``compare``); both ratios are kept.
The planner's own attention time, PaLM's count at the GEMMs' rate, is the same as a causal kernel
at half their rate: 27-30 % of the H100's peak, FlashAttention-2's level.

Rank (:func:`validate`): the published layout with its published recomputation setting, among the
layouts that fit for the same model, GPUs, sequence and batch (each layout: the planner's fastest
variant of one dp, tp, pp, cp, ep that fits); 1 + those faster. Two searches: over the recomputation
settings the stack offered, and over the published one alone (Megatron-LM's layouts recompute where
the planner, finding room not to, runs faster without).

Fits: against all the memory the device reports (H100 81,559 MiB, A100 81,920 MiB), the physical
question a published run answers (it ran), not against the 90 % the planner keeps for what it does
not count (allocator, buffers); each row shows both margins. Llama 3's DP64 fits the device with
3.2 GB to spare and not the planner's 90 % (by 5.4 GB): run as published, it used part of that reserve.

Left out, plainly: attention's kernel efficiency by shape (at 128K it is over half the FLOPs), the
allocator and communication buffers (the 10 % the planner keeps free), stragglers, the optimizer
step, data loading; the schedules' exact orders beyond Megatron-LM's. (Megatron-LM's scatter/gather
sends 1/t of each boundary's activation per tensor-parallel rank, §4.1: what the planner's
sequence-parallel send counts too, ``theory.plan.axis_bytes.pp_message_bytes``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.flops import attention_flops_per_token, flops_per_token
from playbook.theory.plan.cost import DEFAULT_OVERLAP
from playbook.theory.plan.layout import cost_layout, parse_layout
from playbook.hardware import MEM_UTIL

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
MEGATRON_STACK = dict(schedules=("1f1b", "interleaved"), zeros=(0,), recomputes=("none", "full"), overlap="none")
# Table 4: (GPUs, layout, seq_len, sequences per step, published BF16 MFU)
LLAMA3_TABLE_4 = (
    (8192, "dp=64 tp=8 pp=16", 8192, 64 * 32, 0.43),
    (16384, "dp=128 tp=8 pp=16", 8192, 128 * 16, 0.41),
    (16384, "dp=8 tp=8 pp=16 cp=16", 131072, 8 * 16, 0.38),
)
LLAMA3_AS_RUN = "zero=2 recompute=none schedule=interleaved v=8 ends=light"
LLAMA3_STACK = dict(schedules=("1f1b", "interleaved"))
TOP = 0.25  # issue 27's bar: the published layout in the planner's top quarter
# The validation's fit: all the device reports (the physical question: could the run have run?); the
# planner keeps MEM_UTIL of it for what it does not count, which the row shows as ``margin_planner``.
DEVICE_SHARE = 1.0


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
    causal_reading: bool = False  # the paper does not say how it counts attention (module docstring)
    compare: str = "palm"  # the count the predicted MFU is compared in: "palm", or "causal" (module docstring)
    fitted: tuple[str, ...] = ()  # the choices made where the alternative misses: theory.plan.fitted.FITTED


def megatron_model_share(h: int, layers: int, s: int = MEGATRON_S, vocab: int = MEGATRON_V) -> float:
    """Model FLOPs over eq. 3's (which counts the recomputed forward): module docstring."""
    return (72 * (1 + s / (6 * h)) + 6 * vocab / (layers * h)) / (96 * (1 + s / (6 * h)) + 6 * vocab / (layers * h))


MICRO_BATCHES = (1, 2, 4, 8)  # tried where a paper does not print its micro-batch


def megatron_unprinted(cfg: ModelConfig, degrees: str, batch: int, hw: Hardware) -> str:
    """What Table 1 does not print, chosen as the planner would: the micro-batch b and, for a
    pipeline, the chunks per stage v of the interleaved schedule, the fastest predicted that fits
    among :func:`unprinted_options`."""
    options = unprinted_options(cfg, degrees, batch, hw)
    return min(options, key=lambda text: options[text]["step"]["total"])


def unprinted_options(cfg: ModelConfig, degrees: str, batch: int, hw: Hardware) -> dict[str, dict]:
    """Every b of ``MICRO_BATCHES`` and, for a pipeline, every v that gives each chunk the same whole
    number of layers (m a multiple of p), as layout text, with its ``cost_layout`` (Megatron-LM's 2021
    overlap), for those that fit all the device reports."""
    lay = parse_layout(degrees, global_batch=batch)
    per_stage = cfg.n_layers // lay.pp
    vs = [v for v in range(2, per_stage + 1) if per_stage % v == 0] if lay.pp > 1 else [1]
    options = {}
    for b in MICRO_BATCHES:
        m, left = divmod(batch // lay.dp, b)
        if left or (lay.pp > 1 and m % lay.pp):
            continue
        for v in vs:
            text = f"{degrees} b={b}" + (f" schedule=interleaved v={v}" if lay.pp > 1 else "")
            r = cost_layout(
                cfg,
                hw,
                parse_layout(text, global_batch=batch),
                seq_len=MEGATRON_S,
                rank=False,
                overlap=MEGATRON_STACK["overlap"],
                mem_util=DEVICE_SHARE,
            )
            if r["fits"]:
                options[text] = r
    return options


def megatron_runs() -> list[PublishedRun]:
    hw = Hardware.preset("a100-80gb")
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
        layout = megatron_unprinted(cfg, f"dp={gpus // (t * p)} tp={t} pp={p} zero=0 recompute=full", batch, hw)
        text = f"{tflops} TFLOP/s per GPU (eq. 3)"
        out.append(PublishedRun(f"{billions:g}B, {gpus:,} A100s", cfg, hw.name, layout, MEGATRON_S, batch, text, mfu))
    return [PublishedRun(**{**r.__dict__, "stack": MEGATRON_STACK, "fitted": ("overlap", "b and v")}) for r in out]


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
            causal_reading=True,
            compare="causal",
            fitted=("attention count",),
        )
        for gpus, text, seq, batch, mfu in LLAMA3_TABLE_4
    ]


def causal_factor(cfg: ModelConfig, seq_len: int) -> float:
    """PaLM's training FLOPs per token over a causal count's (attention's [T, T] products halved)."""
    full = flops_per_token(cfg, seq_len)
    return full / (full - attention_flops_per_token(cfg, seq_len) / 2)


def validate(run: PublishedRun, *, rank: bool = True) -> dict:
    """One row: the published layout's predicted MFU and memory, whether it fits (all the device's
    reported memory, ``DEVICE_SHARE``; ``margin_planner``: against the planner's ``MEM_UTIL`` of
    it), and its rank (module docstring): 1 + the
    layouts that fit and are faster, among those over ``run.stack`` (``rank_stack`` of ``of_stack``)
    and among those with the published recomputation setting (``rank`` of ``of``); ``top_quarter``:
    it fits and ``rank`` ≤ ``of``/4. A layout that does not fit gets the rank its time would have."""
    hw = Hardware.preset(run.hardware)
    lay = parse_layout(run.layout, global_batch=run.global_batch)
    search = dict(run.stack)
    overlap = search.pop("overlap", DEFAULT_OVERLAP)
    r = cost_layout(
        run.cfg, hw, lay, seq_len=run.seq_len, rank=rank, overlap=overlap, search=search, mem_util=DEVICE_SHARE
    )
    causal = causal_factor(run.cfg, run.seq_len) if run.causal_reading else None
    row = {
        "run": run.run,
        "layout": r["layout"],
        "published": run.published,
        "published_mfu": run.published_mfu,
        "predicted_mfu": r["mfu"],
        "ratio": r["mfu"] / run.published_mfu,
        "published_mfu_causal": causal and run.published_mfu * causal,
        "ratio_causal": causal and r["mfu"] / (run.published_mfu * causal),
        "compare": run.compare,
        "memory": r["memory_total"],
        "fits": r["fits"],
        "margin": r["margin_bytes"],
        "margin_planner": hw.capacity_bytes * MEM_UTIL - r["memory_total"],
    }
    row["ratio_compared"] = row["ratio_causal"] if run.compare == "causal" else row["ratio"]
    if causal:
        row["attention_utilization"] = implied_attention_utilization(run, r, hw)
    if rank:
        row |= {"rank": r["rank_recompute"], "of": r["of_recompute"], "rank_stack": r["rank"], "of_stack": r["of"]}
        row["top_quarter"] = r["fits"] and row["rank"] <= TOP * row["of"]
    return row


def implied_attention_utilization(run: PublishedRun, cost: dict, hw: Hardware) -> dict[str, float]:
    """Per reading of the published MFU ("palm", "causal"), the share of peak a causal attention
    kernel (the masked half skipped) would have run at for the published step time, if everything
    else took the planner's predicted time (``cost``: ``cost_layout``'s); and "planner": the
    planner's own. Module docstring."""
    train, attention = flops_per_token(run.cfg, run.seq_len), attention_flops_per_token(run.cfg, run.seq_len)
    tokens, peak = run.global_batch * run.seq_len, cost["gpus"] * hw.peak_bf16_flops
    executed = tokens * attention / 2  # a causal kernel's FLOPs over all GPUs
    predicted = cost["step"]["compute"] * attention / train  # attention's share of the predicted compute
    rest = cost["step"]["total"] - predicted
    out = {"planner": executed / (predicted * peak)}
    for reading, mfu in (
        ("palm", run.published_mfu),
        ("causal", run.published_mfu * causal_factor(run.cfg, run.seq_len)),
    ):
        published_step = tokens * train / (mfu * peak)
        out[reading] = executed / ((published_step - rest) * peak) if published_step > rest else float("nan")
    return out


def done_when(row: dict) -> dict[str, bool]:
    """Issue 27's three bars for one row: fits, predicted MFU within ±15 % of published (in the count
    the row is compared in, ``ratio_compared``), and in the top quarter of the layouts that fit with
    the published recomputation setting."""
    within = abs(row["ratio_compared"] - 1) <= 0.15
    return {"fits": row["fits"], "within 15 %": within, "top quarter": row["top_quarter"]}
