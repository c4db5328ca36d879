"""Import a Hugging Face ``config.json`` as the fields of a ``ModelConfig``.

Supported ``model_type`` values and what each maps onto (field names are the Hugging Face
``transformers`` convention, e.g. ``LlamaConfig``, ``Qwen2Config``, ``DeepseekV3Config``):

- ``llama`` (Llama 2/3, Llama-3.1's ``rope_scaling`` included), ``mistral``: RMSNorm, RoPE,
  SwiGLU, grouped-query attention: the shape our torch model has.
- ``mixtral``: the same attention, every layer a mixture of ``num_local_experts`` SwiGLU experts of
  width ``intermediate_size``, ``num_experts_per_tok`` routed per token (Jiang et al. 2024,
  arXiv:2401.04088).
- ``qwen2``: Llama's shape plus biases on the q, k and v projections (``qkv_bias``; Qwen2
  Technical Report, Yang et al. 2024, arXiv:2407.10671, §2.2.1).
- ``deepseek_v2``, ``deepseek_v3``: multi-head latent attention (``q_lora_rank`` (null: a full
  q projection), ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) and
  DeepSeekMoE (``n_routed_experts`` of width ``moe_intermediate_size``, ``n_shared_experts``,
  ``num_experts_per_tok``, the first ``first_k_dense_replace`` layers dense of width
  ``intermediate_size``); DeepSeek-V2, arXiv:2405.04434, §2.1-2.2; DeepSeek-V3, arXiv:2412.19437, §2.

Read but not counted, and said so in the config's ``source``: ``rope_scaling`` (it changes RoPE's
angles, not any size), Mistral's ``sliding_window`` (our FLOP and activation counts assume full
causal attention), DeepSeek-V3's multi-token-prediction layers (``num_nextn_predict_layers``: the
published 671B excludes them) and its routers' ``e_score_correction_bias`` (256 per MoE layer).
Refused with one line: what changes a count but is not modelled (``attention_bias`` on Llama,
``mlp_bias``, MoE only every k-th layer).
"""

from __future__ import annotations

from pathlib import Path

from playbook.validate import Range, check_fields, check_types, read_json_object

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "deepseek_v2", "deepseek_v3")
_COMMON = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
_MLA = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_DEEPSEEK_MOE = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
REQUIRED = {
    "llama": _COMMON,
    "mistral": _COMMON,
    "qwen2": _COMMON,
    "mixtral": (*_COMMON, "num_local_experts", "num_experts_per_tok"),
    "deepseek_v2": (*_COMMON, *_MLA, *_DEEPSEEK_MOE),
    "deepseek_v3": (*_COMMON, *_MLA, *_DEEPSEEK_MOE),
}
# the transformers classes' defaults for what a config.json may leave out (neither changes a count)
_DEFAULTS = {
    "llama": dict(rope_theta=10_000.0, rms_norm_eps=1e-6),
    "mistral": dict(rope_theta=10_000.0, rms_norm_eps=1e-6),
    "mixtral": dict(rope_theta=1e6, rms_norm_eps=1e-5),
    "qwen2": dict(rope_theta=10_000.0, rms_norm_eps=1e-6),
    "deepseek_v2": dict(rope_theta=10_000.0, rms_norm_eps=1e-6),
    "deepseek_v3": dict(rope_theta=10_000.0, rms_norm_eps=1e-6),
}


def read(path_or_dict) -> tuple[dict, str, str]:
    """(the config as a dict, a name for it, where it came from). A path may be the ``config.json``
    itself or the model's folder; its name is the file's stem, or the folder's for ``config.json``."""
    if isinstance(path_or_dict, dict):
        raw = path_or_dict
        name = str(raw.get("_name_or_path") or f"hf-{raw.get('model_type', 'model')}").rstrip("/").split("/")[-1]
        return raw, name, "a config.json dict"
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        examples = Path(__file__).resolve().parent.parent / "data" / "hf"
        raise ValueError(f"no config file {str(path)!r}; examples of config.json files are under {examples}")
    raw = read_json_object(path, "Hugging Face config.json")
    name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    return raw, name, str(path)


def _int(raw: dict, key: str, where: str) -> int:
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


# The optional fields, by their Hugging Face names: null means "absent" only where transformers
# reads it so (q_lora_rank null: a full q projection; rope_scaling null: none).
OPTIONAL = {
    "rope_theta": Range("number", 0, 1e15, "500000.0", open_low=True),
    "rms_norm_eps": Range("number", 0, 1, "1e-05", open_low=True),
    "num_key_value_heads": Range("int", 1, 10**5, "8", nullable=True),
    "head_dim": Range("int", 1, 10**5, "128", nullable=True),
    "q_lora_rank": Range("int", 1, 10**6, "1536", nullable=True),
    "n_shared_experts": Range("int", 0, 10**4, "1", nullable=True),
    "first_k_dense_replace": Range("int", 0, 10_000, "1", nullable=True),
    "num_nextn_predict_layers": Range("int", 0, 10_000, "1", nullable=True),
    "moe_layer_freq": Range("int", 1, 10_000, "1"),
}
# sizes a planner loops over: bounded (see validate.MODEL_LIMITS)
_HIGH = {
    "num_hidden_layers": Range("int", 1, 10_000, "32"),
    "vocab_size": Range("int", 1, 10**7, "128256"),
    "hidden_size": Range("int", 1, 10**6, "4096"),
    "max_position_embeddings": Range("int", 1, 10**8, "131072"),
}


def _check(raw: dict, where: str) -> str:
    """The config's model_type, once every field it needs is present; else one line saying what is not."""
    kind = raw.get("model_type")
    check_fields(where, raw, OPTIONAL, sep=": ")
    check_types(where, raw, {"rope_scaling": (dict, type(None)), "tie_word_embeddings": bool})
    if kind not in SUPPORTED:
        what = "has no model_type" if kind is None else f"has model_type {kind!r}, which is not supported"
        raise ValueError(f"{where} {what}; supported model_type values: {', '.join(SUPPORTED)}")
    missing = [k for k in REQUIRED[kind] if raw.get(k) is None]
    if missing:
        raise ValueError(
            f"{where} (model_type {kind!r}) lacks {', '.join(missing)}; a {kind} config needs "
            f"{', '.join(REQUIRED[kind])} (supported model_type values: {', '.join(SUPPORTED)})"
        )
    unmodelled = {
        "attention_bias": "biases on q, k, v and o (only Qwen2's q, k, v biases are modelled)",
        "mlp_bias": "biases in the MLP",
    }
    for key, what in unmodelled.items():
        if raw.get(key):
            raise ValueError(f"{where}: {key}=true ({what}) is not modelled; supported: {key}=false")
    if kind.startswith("deepseek") and raw.get("moe_layer_freq", 1) != 1:
        raise ValueError(
            f"{where}: moe_layer_freq={raw['moe_layer_freq']} (MoE every k-th layer) is not modelled; "
            "supported: moe_layer_freq=1 (every layer after first_k_dense_replace)"
        )
    return kind


def _notes(raw: dict) -> list[str]:
    """What the config says that no count depends on, for the ``source`` line."""
    notes = []
    scaling = raw.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type") or scaling.get("type") or "?"
        rest = ", ".join(f"{k} {v}" for k, v in scaling.items() if k not in ("rope_type", "type"))
        notes.append(f"rope_scaling {kind} ({rest}) changes RoPE's angles, not any count")
    window = raw.get("sliding_window")
    if window and raw.get("use_sliding_window", True):
        notes.append(f"sliding_window {window} not modelled: attention counted over the full causal context")
    if raw.get("num_nextn_predict_layers"):
        notes.append(f"{raw['num_nextn_predict_layers']} multi-token-prediction layer(s) not counted")
    if raw.get("topk_method") == "noaux_tc":
        notes.append(f"routers' e_score_correction_bias ({raw['n_routed_experts']} per MoE layer) not counted")
    return notes


def model_fields(path_or_dict, name: str | None = None) -> dict:
    """Keyword arguments of ``ModelConfig`` for a Hugging Face config (see the module docstring).
    Raises ``ValueError`` with one line on an unsupported ``model_type`` or a missing field."""
    raw, default_name, where = read(path_or_dict)
    kind = _check(raw, where)
    get = {k: _int(raw, k, where) for k in REQUIRED[kind]}
    check_fields(where, get, _HIGH, sep=": ")
    heads = get["num_attention_heads"]
    kv_heads = raw.get("num_key_value_heads") or heads
    fields = dict(
        vocab_size=get["vocab_size"],
        hidden=get["hidden_size"],
        n_layers=get["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=kv_heads,
        ffn_hidden=get["intermediate_size"],
        max_seq_len=get["max_position_embeddings"],
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_theta=float(raw.get("rope_theta", _DEFAULTS[kind]["rope_theta"])),
        norm_eps=float(raw.get("rms_norm_eps", _DEFAULTS[kind]["rms_norm_eps"])),
        qkv_bias=kind == "qwen2",
        name=name or default_name,
    )
    if raw.get("head_dim") and raw["head_dim"] * heads != fields["hidden"]:
        fields["head_dim"] = _int(raw, "head_dim", where)
    if kind == "mixtral":
        fields.update(n_experts=get["num_local_experts"], top_k=get["num_experts_per_tok"])
        fields.update(expert_ffn_hidden=get["intermediate_size"])
    if kind.startswith("deepseek"):
        fields.update(
            n_kv_heads=heads,  # MLA expands its latent into keys and values for every head
            attention="mla",
            q_lora_rank=raw.get("q_lora_rank") or 0,
            **{k: get[k] for k in _MLA},
            n_experts=get["n_routed_experts"],
            top_k=get["num_experts_per_tok"],
            expert_ffn_hidden=get["moe_intermediate_size"],
            n_shared_experts=raw.get("n_shared_experts") or 0,
            n_dense_layers=raw.get("first_k_dense_replace") or 0,
        )
    notes = "; ".join(_notes(raw))
    fields["source"] = f"Hugging Face config.json ({where}), model_type {kind}" + (f"; {notes}" if notes else "")
    return fields
