"""Configure: model configs and their presets from ``data/models/`` (hardware profiles: ``playbook.hardware``).

Every size is validated where it is made, and a bad one is refused with the constraint it breaks
and values that would work, so a learner never meets a shape error deep inside torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from playbook.validate import MODEL_LIMITS, check_fields, read_json_object

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MODELS_DIR = DATA_DIR / "models"


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending: the valid choices for a degree that must divide n.
    Pairs (d, n // d) up to the square root: a 19-digit n takes as long as a 10-digit one."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def require_positive(**sizes: int) -> None:
    """Raise ``ValueError`` naming every size that is not a positive integer."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def require_divides(part_name: str, part: int, whole_name: str, whole: int) -> None:
    """Raise ``ValueError`` unless ``part`` divides ``whole``, listing the values that would."""
    if whole % part:
        raise ValueError(
            f"{part_name}={part} does not divide {whole_name}={whole}; "
            f"try {part_name} in {{{', '.join(map(str, divisors(whole)))}}}"
        )


def preset_file(kind: str, name: str, folder: Path, files: str = "") -> Path:
    """The file of a preset *name*: only the names listed in ``folder`` count, so a path such as
    ``../hardware/h100-sxm`` is never read as a model (a name is a name, a path is a path)."""
    known = sorted(p.stem for p in folder.glob("*.json"))
    if name not in known:
        tried = " (tried as a preset name, not as a path)" if any(c in name for c in "/\\") else ""
        raise ValueError(f"unknown {kind} {name!r}{tried}; known {kind}s: {', '.join(known)}{files}")
    return folder / f"{name}.json"


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer in the Llama style (RMSNorm, RoPE, SwiGLU, grouped-query attention).

    Dense by default; ``n_experts > 0`` makes the MLP of every layer after the first
    ``n_dense_layers`` a mixture of experts (Switch/Mixtral/DeepSeek style). ``attention="mla"``
    describes DeepSeek's multi-head latent attention, for counting only (our torch model is GQA).
    """

    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    ffn_hidden: int
    max_seq_len: int
    n_kv_heads: int | None = None  # None: as many as n_heads (plain multi-head attention)
    head_dim: int | None = None  # None: hidden // n_heads
    tie_embeddings: bool = False
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False  # biases on q, k and v (Qwen2), for counting only (our torch model has none)
    # mixture of experts (filled in by the expert-parallel chapter)
    n_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int = 0
    n_shared_experts: int = 0
    n_dense_layers: int = 0
    # multi-head latent attention (DeepSeek-V2/V3), for parameter and memory counts
    attention: str = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    name: str = "custom"
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        require_positive(
            vocab_size=self.vocab_size,
            hidden=self.hidden,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            ffn_hidden=self.ffn_hidden,
            max_seq_len=self.max_seq_len,
            n_kv_heads=self.kv_heads,
        )
        check_fields(f"model {self.name!r}", dataclasses.asdict(self), MODEL_LIMITS)
        if self.head_dim is None:
            require_divides("n_heads", self.n_heads, "hidden", self.hidden)
        else:
            require_positive(head_dim=self.head_dim)
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}: every "
                f"key/value head must serve the same number of query heads; "
                f"try n_kv_heads in {{{', '.join(map(str, divisors(self.n_heads)))}}}"
            )
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"attention must be 'gqa' or 'mla', got {self.attention!r}")
        if self.qkv_bias and self.attention != "gqa":
            raise ValueError("qkv_bias is for grouped-query attention (Qwen2); try qkv_bias=False with attention='mla'")
        if self.n_experts:
            require_positive(n_experts=self.n_experts, top_k=self.top_k, expert_ffn_hidden=self.expert_ffn_hidden)
            if self.top_k > self.n_experts:
                raise ValueError(
                    f"top_k={self.top_k} exceeds n_experts={self.n_experts}; try top_k in 1..{self.n_experts}"
                )
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ValueError(f"n_dense_layers={self.n_dense_layers} must be in 0..n_layers={self.n_layers}")

    # ---- derived sizes -------------------------------------------------------------------------
    def rope_scaling_note(self, seq_len: int) -> str:
        """'' up to ``max_seq_len`` (the config's ``max_position_embeddings``); past it, one sentence
        saying what a run at ``seq_len`` assumes. Long-context training extends RoPE beyond the
        positions a model was trained at, by position interpolation (Chen et al. 2023,
        arXiv:2306.15595: positions scaled by max/seq) or YaRN (Peng et al. 2023, arXiv:2309.00071: per
        frequency band, Llama 3.1's and DeepSeek-V3's context extension), and then trains at the new
        length; either rescales the rotation angles only, so the FLOPs and bytes the theory counts
        are those of any sequence of that length. The model the chapters run keeps its RoPE table."""
        if seq_len <= self.max_seq_len:
            return ""
        return (
            f"seq {seq_len:,} is past {self.name}'s max_position_embeddings {self.max_seq_len:,}: this assumes RoPE "
            f"extended {seq_len / self.max_seq_len:g}x (position interpolation or YaRN-style scaling, as long-context "
            "training does); FLOPs and bytes are counted as for any sequence of that length"
        )

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def dim_head(self) -> int:
        return self.hidden // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    # ---- counting ------------------------------------------------------------------------------
    def attention_params(self) -> int:
        """Weights of one attention block, GQA or MLA; with ``qkv_bias`` the q, k and v biases too."""
        h = self.hidden
        if self.attention == "mla":
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.n_heads * qk_head
            else:
                q = h * self.n_heads * qk_head
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)  # down-projection plus the shared rope key
                + self.kv_lora_rank  # its RMSNorm
                + self.kv_lora_rank * self.n_heads * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + self.n_heads * self.v_head_dim * h
        q_out = self.n_heads * self.dim_head
        kv_out = self.kv_heads * self.dim_head
        bias = q_out + 2 * kv_out if self.qkv_bias else 0
        return h * q_out + 2 * h * kv_out + q_out * h + bias

    def dense_mlp_params(self) -> int:
        """SwiGLU: gate and up projections h -> f, down projection f -> h."""
        return 3 * self.hidden * self.ffn_hidden

    def moe_mlp_params(self) -> int:
        """Router (h -> E, no bias) plus E routed and the shared experts, each a SwiGLU of width expert_ffn_hidden."""
        expert = 3 * self.hidden * self.expert_ffn_hidden
        return self.hidden * self.n_experts + (self.n_experts + self.n_shared_experts) * expert

    def layer_params(self, moe: bool = False) -> int:
        """One transformer block: two RMSNorm weights, attention, and a dense or MoE MLP."""
        return 2 * self.hidden + self.attention_params() + (self.moe_mlp_params() if moe else self.dense_mlp_params())

    def embedding_params(self) -> int:
        """Input embedding, final RMSNorm, and the output head unless it is tied to the embedding."""
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden
        return self.vocab_size * self.hidden + self.hidden + head

    def num_params(self) -> int:
        """Exact parameter count: equals ``sum(p.numel())`` of our built model, and the published
        checkpoints' count for the Llama presets."""
        dense_layers = self.n_layers - self.n_moe_layers
        return (
            self.embedding_params()
            + dense_layers * self.layer_params(moe=False)
            + self.n_moe_layers * self.layer_params(moe=True)
        )

    def num_param_tensors(self) -> int:
        """Parameter tensors in our torch model: embedding, final norm, head unless tied; per dense
        block two norms, q/k/v/o and gate/up/down; per MoE block two norms, q/k/v/o, the router and
        gate/up/down of every routed and shared expert (and q/k/v biases with ``qkv_bias``). PyTorch's
        Adam keeps one ``step`` counter each."""
        per_moe = 2 + 4 + 1 + 3 * (self.n_experts + self.n_shared_experts)
        return (
            2
            + (0 if self.tie_embeddings else 1)
            + 9 * (self.n_layers - self.n_moe_layers)
            + per_moe * self.n_moe_layers
            + (3 * self.n_layers if self.qkv_bias else 0)
        )

    def active_params(self) -> int:
        """Parameters touched by one token: only top_k routed experts (plus shared ones) per MoE layer."""
        if not self.is_moe:
            return self.num_params()
        unused = (self.n_experts - self.top_k) * 3 * self.hidden * self.expert_ffn_hidden
        return self.num_params() - self.n_moe_layers * unused

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        """Load ``data/models/<name>.json``; unknown names list the known ones."""
        raw = read_json_object(preset_file("model preset", name, MODELS_DIR), "model preset")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in fields}, name=name)

    @staticmethod
    def presets() -> list[str]:
        return sorted(p.stem for p in MODELS_DIR.glob("*.json"))

    @classmethod
    def from_hf_config(cls, path_or_dict, name: str | None = None) -> ModelConfig:
        """A Hugging Face ``config.json`` (a path, the model's folder, or the dict) for Llama, Mistral,
        Mixtral, Qwen2 and DeepSeek-V2/V3; the mapping and what it leaves out: ``playbook.hf_config``."""
        from playbook.hf_config import model_fields

        return cls(**model_fields(path_or_dict, name))

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
