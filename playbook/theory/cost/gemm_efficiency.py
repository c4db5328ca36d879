"""How fast a layer's matmuls run as a function of their shapes: why a micro-batch of 2 can beat 1.

The planner's compute is FLOPs / (peak · ``achievable_flops_fraction``): the rate of a *large* GEMM.
A smaller one runs slower, for two reasons NVIDIA's "Matrix Multiplication Background User's Guide"
(DU-09799-001, 2023) sets out:

- **Tile and wave quantization** (§3): a GEMM's [M, N] output is cut into tiles (128 × 128 here,
  one of cuBLAS's usual sizes, §2.3), one thread block each, run in waves of one block per SM. The
  last wave and the last row and column of tiles are partly idle:
  ``efficiency = M·N / (waves · SMs · 128²)`` with ``waves = ⌈tiles / SMs⌉``.
- **Memory bound** (§2, the roofline): a GEMM moves (M·K + K·N + M·N) bf16 elements and does
  2·M·N·K FLOPs; below ``rate / memory_bandwidth`` FLOPs per byte it waits on memory.

Or, where the hardware profile carries ``playbook calibrate``'s measured curve (``matmul``: the
rate of square n × n × n matmuls on this machine), the rate read off that curve at the square
GEMM of the same FLOPs, n = (M·N·K)^(1/3), interpolated log-log and held flat past its ends.

Each is relative to the profile's large-GEMM rate (peak × achievable fraction; the calibrated
profile's is its median size's), so a factor over 1 is time the flat rate did not count.

The layer's GEMMs (Megatron-LM's, Narayanan et al. 2021, arXiv:2104.04473, §3): with tp + SP each
sees the b·s/cp tokens of a micro-batch gathered over tp; fused QKV and o, fused gate-and-up and
down (columns / rows split over tp), the output head; MoE experts each see ep·T·k/E tokens on
average, unsplit by tp. Each runs forward, for the input gradient ([M, K] output) and for the
weight gradient ([K, N] output, over M). Not modelled: attention's own kernel (its FLOPs keep the
flat rate), MLA's low-rank projections (timed as plain q, k, v of its head sizes), kernel launch
overheads, cuBLAS choosing other tiles, and the recomputed forward (it takes the step's factor).
"""

from __future__ import annotations

import functools
import math

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.flops import attention_head_dims, flops_per_token

TILE = 128  # output tile edge (the guide's §3 examples; cuBLAS picks among 64-256)
BYTES = 2  # bf16 operands


def wave_efficiency(m: int, n: int, sms: int, tile: int = TILE) -> float:
    """Share of the SMs' tile slots an [m, n] output fills: m·n / (waves · sms · tile²)."""
    waves = math.ceil(math.ceil(m / tile) * math.ceil(n / tile) / sms)
    return m * n / (waves * sms * tile * tile)


def curve_rate(curve: tuple[tuple[float, float], ...], size: float) -> float:
    """FLOP/s at square size ``size`` from ((size, FLOP/s), ...) ascending: log-log between points."""
    if size <= curve[0][0]:
        return curve[0][1]
    for (s0, r0), (s1, r1) in zip(curve, curve[1:]):
        if size <= s1:
            t = math.log(size / s0) / math.log(s1 / s0)
            return math.exp(math.log(r0) + t * math.log(r1 / r0))
    return curve[-1][1]


def gemm_efficiency(m: int, n: int, k: int, hw: Hardware) -> float:
    """Rate of one [m, k] @ [k, n] GEMM over the profile's large-GEMM rate (module docstring); 1
    for a profile with neither an SM count nor a measured curve."""
    return _efficiency(m, n, k, _key(hw))


def _key(hw: Hardware) -> tuple:
    """What the efficiency depends on, hashable (``Hardware.matmul`` is left out of its hash)."""
    curve = tuple(sorted((float(p["size"]), float(p["flops_per_s"])) for p in hw.matmul))
    return hw.peak_bf16_flops * hw.achievable_flops_fraction, hw.memory_bandwidth, hw.sms, curve


@functools.lru_cache(maxsize=65536)
def _efficiency(m: int, n: int, k: int, key: tuple) -> float:
    rate, bandwidth, sms, curve = key
    if curve:
        return curve_rate(curve, (m * n * k) ** (1 / 3)) / rate
    if not sms:
        return 1.0
    flops = 2 * m * n * k
    seconds = max(flops / (rate * wave_efficiency(m, n, sms)), BYTES * (m * k + k * n + m * n) / bandwidth)
    return flops / rate / seconds


def layer_gemms(cfg: ModelConfig, tokens: int, tp: int, ep: int = 1) -> list[tuple[int, int, int, float]]:
    """The model's forward GEMMs on one rank as (M, N, K, FLOP weight per token over the whole
    model); ``tokens``: one micro-batch's b·s/cp."""
    h, a, kv = cfg.hidden, cfg.n_heads, cfg.kv_heads
    qk, v = attention_head_dims(cfg)
    q_out = a * qk + kv * (qk + v) if cfg.attention != "mla" else a * (2 * qk + v)
    dense, moe = cfg.n_layers - cfg.n_moe_layers, cfg.n_moe_layers
    out = [
        (tokens, -(-q_out // tp), h, cfg.n_layers * h * q_out),  # fused QKV, columns over tp
        (tokens, h, -(-(a * v) // tp), cfg.n_layers * a * v * h),  # o, rows over tp
        (tokens, -(-cfg.vocab_size // tp), h, h * cfg.vocab_size),  # output head
    ]
    if dense:
        f = cfg.ffn_hidden
        out += [(tokens, -(-2 * f // tp), h, dense * 2 * f * h), (tokens, h, -(-f // tp), dense * f * h)]
    if moe:
        fe, k = cfg.expert_ffn_hidden, cfg.top_k
        per_expert = max(1, tokens * ep * k // cfg.n_experts)
        out += [(per_expert, 2 * fe, h, moe * k * 2 * fe * h), (per_expert, h, fe, moe * k * fe * h)]
        if cfg.n_shared_experts:
            fs = fe * cfg.n_shared_experts
            out += [(tokens, 2 * fs, h, moe * 2 * fs * h), (tokens, h, fs, moe * fs * h)]
    return out


def compute_factor(cfg: ModelConfig, hw: Hardware, *, tokens: int, tp: int, ep: int = 1, seq_len: int) -> float:
    """A training step's compute time over the flat rate's: Σ FLOPs / efficiency over the GEMMs
    (forward, input gradient, weight gradient), the rest (attention) at efficiency 1, over Σ FLOPs."""
    return _factor(cfg, _key(hw), tokens, tp, ep, seq_len)


@functools.lru_cache(maxsize=4096)
def _factor(cfg: ModelConfig, key: tuple, tokens: int, tp: int, ep: int, seq_len: int) -> float:
    total = flops_per_token(cfg, seq_len)
    slow = linear = 0.0
    for m, n, k, weight in layer_gemms(cfg, tokens, tp, ep):
        linear += 6 * weight
        forward, dgrad, wgrad = _efficiency(m, n, k, key), _efficiency(m, k, n, key), _efficiency(k, n, m, key)
        slow += 2 * weight * (1 / forward + 1 / dgrad + 1 / wgrad)
    rest = max(total - linear, 0.0)
    return (slow + rest) / (linear + rest)
