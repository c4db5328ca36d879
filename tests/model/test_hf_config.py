"""ModelConfig.from_hf_config: the example config.json files under data/hf/ count what was published,
and a config we cannot count is refused in one line that says what is supported.

The published totals below are facts about released checkpoints, written here by hand with their
source, not taken from the code's output.
"""

from __future__ import annotations

import json

import pytest

from playbook.config import DATA_DIR, ModelConfig
from playbook.theory.cost.flops import matmul_params

HF = DATA_DIR / "hf"

# Total parameters of the published BF16 checkpoints: the safetensors parameter count on each
# model's Hugging Face page (the page rounds it: "8.03B", "7.24B", "46.7B", "7.62B").
PUBLISHED_EXACT = {
    "Llama-3.1-8B": 8_030_261_248,  # meta-llama/Llama-3.1-8B
    "Mistral-7B-v0.1": 7_241_732_096,  # mistralai/Mistral-7B-v0.1
    "Mixtral-8x7B-v0.1": 46_702_792_704,  # mistralai/Mixtral-8x7B-v0.1
    "Qwen2-7B": 7_615_616_512,  # Qwen/Qwen2-7B (q, k, v biases included: 28 x 4,608 = 129,024)
}


def load(name: str) -> ModelConfig:
    return ModelConfig.from_hf_config(HF / f"{name}.json")


def raw(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(PUBLISHED_EXACT))
def test_exact_published_parameter_count(name):
    cfg = load(name)
    assert cfg.name == name
    assert cfg.num_params() == PUBLISHED_EXACT[name]


def test_qwen2_biases_by_hand():
    # Qwen2-7B: 28 query heads and 4 KV heads of 128 channels; a bias on q (3,584), k (512), v (512)
    cfg = load("Qwen2-7B")
    assert cfg.qkv_bias and cfg.dim_head == 128
    assert cfg.num_params() - cfg.replace(qkv_bias=False).num_params() == 28 * (3584 + 512 + 512)
    with pytest.raises(NotImplementedError, match="qkv_bias"):  # our torch model has no biases: refuse, not miscount
        from playbook.model.gpt import GPT

        GPT(cfg.replace(vocab_size=64, hidden=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=8))


def test_imports_equal_the_hand_written_presets():
    # data/models/ were written from the same published configs by another hand: every size agrees
    for hf_name, preset in [
        ("Llama-3.1-8B", "llama-3.1-8b"),
        ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("DeepSeek-V3", "deepseek-v3"),
    ]:
        assert load(hf_name).replace(name=preset) == ModelConfig.preset(preset)


def test_deepseek_v3_main_model_without_mtp():
    # DeepSeek-V3 Technical Report (arXiv:2412.19437), abstract and §4.2: 671B total, 37B activated
    # per token, the main model WITHOUT the multi-token-prediction (MTP) module; the Hugging Face
    # checkpoint's 685B adds the 14B MTP module (model card). We count the main model, so 671B.
    # Only rounded figures are published (the safetensors total there mixes FP8 weights and their
    # scales), so the check is to the published precision.
    cfg = load("DeepSeek-V3")
    assert round(cfg.num_params() / 1e9) == 671
    assert cfg.n_moe_layers == 58 and cfg.q_lora_rank == 1536 and cfg.kv_lora_rank == 512
    assert "multi-token-prediction" in cfg.source
    # The MTP module (§2.2): one more MoE layer, a projection [h, 2h], three RMSNorms, and in the
    # checkpoint its own copies of the embedding and the output head: 13.46B by this count. With it the
    # total comes within 1B of the card's 685B (rounded, and counting the FP8 weights' scale tensors).
    h, V = cfg.hidden, cfg.vocab_size
    mtp = cfg.layer_params(moe=True) + 2 * h * h + 3 * h + 2 * V * h
    assert abs(cfg.num_params() + mtp - 685e9) < 1e9


def test_deepseek_v2_lite():
    # DeepSeek-V2 (arXiv:2405.04434), Appendix B, and the deepseek-ai/DeepSeek-V2-Lite model card:
    # 15.7B total parameters, 2.4B activated per token. Published to one decimal: compare to one decimal.
    cfg = load("DeepSeek-V2-Lite")
    assert round(cfg.num_params() / 1e9, 1) == 15.7
    assert cfg.q_lora_rank == 0 and cfg.n_dense_layers == 1 and cfg.n_shared_experts == 2
    # "2.4B activated": the multiplied parameters (input embedding, a lookup, left out), truncated
    assert int(matmul_params(cfg) / 1e8) == 24


def test_rope_scaling_and_window_are_read_not_counted():
    llama = load("Llama-3.1-8B")
    assert llama.max_seq_len == 131072 and llama.rope_theta == 500000.0
    assert "rope_scaling llama3" in llama.source and "original_max_position_embeddings 8192" in llama.source
    assert "sliding_window 4096 not modelled" in load("Mistral-7B-v0.1").source


def test_a_dict_and_a_folder_work_too(tmp_path):
    d = raw("Qwen2-7B")
    assert ModelConfig.from_hf_config({**d, "_name_or_path": "Qwen/Qwen2-7B"}).name == "Qwen2-7B"
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(d))
    cfg = ModelConfig.from_hf_config(tmp_path / "my-model")
    assert cfg.name == "my-model" and cfg.num_params() == PUBLISHED_EXACT["Qwen2-7B"]
    # transformers' defaults fill what a config leaves out: untied embeddings, as Qwen2Config's
    bare = {k: v for k, v in d.items() if k not in ("tie_word_embeddings", "rope_theta", "rms_norm_eps")}
    assert ModelConfig.from_hf_config(bare).num_params() == PUBLISHED_EXACT["Qwen2-7B"]


def test_explicit_head_dim():
    # Mistral-Nemo style: head_dim 128 with hidden 5120 and 32 heads (5120 / 32 = 160)
    d = {**raw("Mistral-7B-v0.1"), "hidden_size": 5120, "head_dim": 128}
    cfg = ModelConfig.from_hf_config(d)
    assert cfg.dim_head == 128
    assert cfg.attention_params() == 5120 * 32 * 128 * 2 + 2 * 5120 * 8 * 128


# ---- refusals: one line, naming what is wrong and what is supported -----------------------------
SUPPORTED = "llama, mistral, mixtral, qwen2, deepseek_v2, deepseek_v3"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"model_type": "gpt2"},
            f"model_type 'gpt2', which is not supported; supported model_type values: {SUPPORTED}",
        ),
        ({"model_type": None}, f"has no model_type; supported model_type values: {SUPPORTED}"),
        ({"intermediate_size": None}, "(model_type 'llama') lacks intermediate_size; a llama config needs vocab_size"),
        ({"hidden_size": "4096"}, "hidden_size must be a positive integer, got '4096'"),
        ({"attention_bias": True}, "attention_bias=true (biases on q, k, v and o"),
        ({"mlp_bias": True}, "mlp_bias=true (biases in the MLP) is not modelled"),
    ],
)
def test_refusals_are_one_line(change, message):
    d = {**raw("Llama-3.1-8B"), **change}
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf_config(d)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_deepseek_refusals(tmp_path):
    d = {k: v for k, v in raw("DeepSeek-V2-Lite").items() if k != "kv_lora_rank"}
    with pytest.raises(ValueError, match=r"\(model_type 'deepseek_v2'\) lacks kv_lora_rank; "):
        ModelConfig.from_hf_config(d)
    with pytest.raises(ValueError, match="moe_layer_freq=2 .* not modelled; supported: moe_layer_freq=1"):
        ModelConfig.from_hf_config({**raw("DeepSeek-V3"), "moe_layer_freq": 2})


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no config file .*; examples of config.json files are under"):
        ModelConfig.from_hf_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        ModelConfig.from_hf_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list"):
        ModelConfig.from_hf_config(tmp_path / "list.json")
