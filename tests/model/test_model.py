"""The small GPT: exact parameter count, shapes, deterministic init, causality, GQA, tying, learning."""

import math

import pytest
import torch

from playbook.config import ModelConfig
from playbook.data import SyntheticTask
from playbook.model.attention import causal_attention
from playbook.model.gpt import GPT

RANDOM_CONFIGS = [
    dict(vocab_size=50, hidden=48, n_layers=3, n_heads=6, n_kv_heads=3, ffn_hidden=100, max_seq_len=16),
    dict(vocab_size=33, hidden=32, n_layers=1, n_heads=4, ffn_hidden=70, max_seq_len=8, tie_embeddings=True),
    dict(vocab_size=17, hidden=40, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=12, head_dim=12),
    dict(
        vocab_size=64,
        hidden=64,
        n_layers=2,
        n_heads=8,
        n_kv_heads=8,
        ffn_hidden=96,
        max_seq_len=32,
        tie_embeddings=True,
    ),
]


def configs():
    return [ModelConfig.preset("gpt-tiny"), ModelConfig.preset("gpt-small")] + [
        ModelConfig(**c) for c in RANDOM_CONFIGS
    ]


@pytest.mark.parametrize(
    "cfg", configs(), ids=lambda c: c.name if c.name != "custom" else f"h{c.hidden}-a{c.n_heads}-g{c.kv_heads}"
)
def test_num_params_matches_config(cfg):
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


@pytest.mark.parametrize("cfg", configs()[:4], ids=["tiny", "small", "gqa", "mha-tied"])
def test_forward_shapes_and_loss(cfg):
    model = GPT(cfg)
    tokens = torch.randint(cfg.vocab_size, (3, cfg.max_seq_len))
    logits = model(tokens)
    assert logits.shape == (3, cfg.max_seq_len, cfg.vocab_size)
    targets = torch.randint(cfg.vocab_size, (3, cfg.max_seq_len))
    logits2, loss = model(tokens, targets)
    assert torch.equal(logits, logits2)
    assert loss.ndim == 0
    # near-uniform predictions at init: loss close to ln(vocab)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.2


def test_presets_are_divisible_for_the_parallel_chapters():
    for name in ("gpt-tiny", "gpt-small"):
        cfg = ModelConfig.preset(name)
        assert cfg.source == "teaching preset"
        # tensor parallel over 2 ranks splits kv heads, over 4 splits heads, ffn and vocab; 2 pipeline stages
        assert cfg.kv_heads % 2 == 0 and cfg.n_layers % 2 == 0
        assert cfg.n_heads % 4 == 0 and cfg.ffn_hidden % 4 == 0 and cfg.vocab_size % 4 == 0


def test_deterministic_init_independent_of_global_rng():
    cfg = ModelConfig.preset("gpt-tiny")
    torch.manual_seed(1)
    a = GPT(cfg, seed=3)
    state = torch.get_rng_state()
    torch.manual_seed(999)
    torch.rand(10)
    b = GPT(cfg, seed=3)
    c = GPT(cfg, seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if pa.ndim > 1:
            assert not torch.equal(pa, pc), name
    # building a model does not consume the global RNG
    torch.set_rng_state(state)
    expected = torch.rand(3)
    torch.set_rng_state(state)
    GPT(cfg, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_init_scales():
    cfg = ModelConfig.preset("gpt-small")
    model = GPT(cfg, seed=0)
    block = model.blocks[0]
    assert torch.equal(block.attn_norm.weight, torch.ones(cfg.hidden))
    assert abs(block.attn.q_proj.weight.std().item() - 0.02) < 0.002
    resid = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert abs(block.mlp.down_proj.weight.std().item() - resid) < 0.1 * resid
    assert abs(block.attn.o_proj.weight.std().item() - resid) < 0.1 * resid


def test_causal_future_tokens_do_not_change_earlier_logits():
    cfg = ModelConfig.preset("gpt-tiny")
    model = GPT(cfg)
    tokens = torch.randint(cfg.vocab_size, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_causal_attention_matches_torch_sdpa_with_gqa():
    q = torch.randn(2, 4, 7, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    ours = causal_attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), is_causal=True
    )
    assert torch.allclose(ours, ref, atol=1e-5)


def test_gqa_validation_and_shapes():
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(vocab_size=16, hidden=32, n_layers=1, n_heads=4, n_kv_heads=3, ffn_hidden=8, max_seq_len=8)
    cfg = ModelConfig.preset("gpt-tiny")
    attn = GPT(cfg).blocks[0].attn
    assert attn.q_proj.weight.shape == (cfg.n_heads * cfg.dim_head, cfg.hidden)
    assert attn.k_proj.weight.shape == (cfg.kv_heads * cfg.dim_head, cfg.hidden)
    assert attn.v_proj.weight.shape == (cfg.kv_heads * cfg.dim_head, cfg.hidden)
    for p in GPT(cfg).parameters():
        assert p.ndim in (1, 2)  # no biases anywhere: norms are the only vectors
    assert sum(p.ndim == 1 for p in GPT(cfg).parameters()) == 2 * cfg.n_layers + 1


def test_odd_head_dim_is_refused():
    cfg = ModelConfig(vocab_size=16, hidden=12, n_layers=1, n_heads=4, ffn_hidden=8, max_seq_len=8)  # head_dim 3
    with pytest.raises(ValueError, match="head_dim must be even"):
        GPT(cfg)


def test_moe_config_builds_the_moe_mlp_after_the_dense_layers():
    cfg = ModelConfig.preset("gpt-tiny").replace(n_experts=4, top_k=2, expert_ffn_hidden=32, n_dense_layers=1)
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    assert type(model.blocks[0].mlp).__name__ == "SwiGLU" and type(model.blocks[1].mlp).__name__ == "MoEMLP"
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, 2, 8)
    logits, loss = model(tokens, targets)
    assert torch.allclose(
        loss,
        torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1)) + model.aux_loss(),
    )


def test_tied_embeddings_share_storage():
    cfg = ModelConfig.preset("gpt-tiny").replace(tie_embeddings=True)
    model = GPT(cfg)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.lm_head.weight.data_ptr() == model.tok_emb.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    untied = GPT(ModelConfig.preset("gpt-tiny"))
    assert untied.lm_head.weight.data_ptr() != untied.tok_emb.weight.data_ptr()


def test_seq_len_over_max_is_a_clear_error():
    cfg = ModelConfig.preset("gpt-tiny")
    model = GPT(cfg)
    with pytest.raises(ValueError, match="max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_positions_default_is_arange():
    cfg = ModelConfig.preset("gpt-tiny")
    model = GPT(cfg)
    tokens = torch.randint(cfg.vocab_size, (2, 10))
    with torch.no_grad():
        assert torch.allclose(model(tokens), model(tokens, positions=torch.arange(10)))
        assert not torch.allclose(model(tokens), model(tokens, positions=torch.arange(5, 15)))


def test_rope_is_relative():
    """q·k after RoPE depends only on the distance between positions."""
    rope = GPT(ModelConfig.preset("gpt-tiny")).blocks[0].attn.rope
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return (rope(q, torch.tensor([i])) * rope(k, torch.tensor([j]))).sum()

    assert torch.allclose(score(3, 1), score(10, 8), atol=1e-5)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_gives_the_same_gradients(mode):
    cfg = ModelConfig.preset("gpt-tiny")
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, 4, 16)
    ref, other = GPT(cfg), GPT(cfg, recompute=mode)
    ref(tokens, targets)[1].backward()
    other(tokens, targets)[1].backward()
    for (name, a), b in zip(ref.named_parameters(), other.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
    with pytest.raises(ValueError, match="recompute"):
        GPT(cfg, recompute="some")


def test_training_approaches_entropy_floor():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("gpt-tiny")
    task = SyntheticTask(cfg.vocab_size, seed=0)
    model = GPT(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(150):
        tokens, targets = task.batch(step, 16, 32)
        _, loss = model(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    floor = task.entropy_floor()
    start, end = losses[0], sum(losses[-20:]) / 20
    assert start > math.log(cfg.vocab_size) - 0.2  # ~4.16 nats
    assert end < floor + 0.3  # floor ~1.14 nats
    assert end > floor - 0.1  # cannot beat the entropy floor by more than noise


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt-small", "gpt-tiny-moe"])
def test_param_tensor_count_matches_the_built_model(name):
    cfg = ModelConfig.preset(name)  # AdamW keeps one step counter per tensor: predictions need the count
    assert cfg.num_param_tensors() == len(list(GPT(cfg).parameters()))
