"""FP8 (``theory.plan.precision``; DeepSeek-AI 2024, arXiv:2412.19437, §3.3) and the mesh order in the planner's step time."""

import dataclasses

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.flops import flops_per_token
from playbook.theory.plan.cost import link, step_cost
from playbook.theory.plan.planner import plan

H100 = Hardware.preset("h100-sxm")
LAYOUT = dict(dp=8, tp=8, pp=2, cp=1, zero=1, micro_batch=1, microbatches=8, recompute="none", gpus_per_node=8)


def test_fp8_runs_the_linear_layers_at_twice_bf16():
    """Only the linear layers of the blocks go to FP8 (§3.3.1: embedding, output head, gating, norms
    and attention stay BF16): their training FLOPs, 6 per parameter per token, counted here from the
    config's shapes, at H100's dense FP8 peak (1,979 TFLOPS, twice BF16), the rest as before."""
    cfg = ModelConfig.preset("llama-3.1-8b")
    h, f, a, g, d, s = cfg.hidden, cfg.ffn_hidden, cfg.n_heads, cfg.kv_heads, cfg.dim_head, 8192
    linear = 6 * cfg.n_layers * (2 * h * a * d + 2 * h * g * d + 3 * h * f)
    share = linear / flops_per_token(cfg, s)
    bf16, fp8 = (step_cost(cfg, H100, ep=1, seq_len=s, precision=p, **LAYOUT) for p in ("bf16", "fp8"))
    speedup = 1979e12 / H100.peak_bf16_flops  # the datasheet's dense FP8 over the profile's BF16 (989.4)
    assert fp8.compute == pytest.approx(bf16.compute * (share / speedup + 1 - share))
    assert fp8.axes["tp"] == bf16.axes["tp"] and fp8.model_flops == bf16.model_flops  # MFU still over BF16 peak


def test_fp8_dispatch_moves_three_quarters_of_eps_bytes():
    """§3.3.4: dispatch and its gradient in FP8, both combines in BF16. Without latency the all-to-all
    time is its bytes over the bandwidth, so exactly 3/4."""
    cfg = ModelConfig.preset("mixtral-8x7b")
    hw = dataclasses.replace(H100, intra_node_latency=0.0, inter_node_latency=0.0)
    lay = LAYOUT | dict(tp=1, dp=16, pp=1, zero=1)
    bf16, fp8 = (step_cost(cfg, hw, ep=8, seq_len=4096, precision=p, **lay) for p in ("bf16", "fp8"))
    assert fp8.axes["ep"][0] == pytest.approx(0.75 * bf16.axes["ep"][0])


def test_a_device_without_fp8_is_refused_in_one_line():
    cfg, a100 = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("a100-80gb")
    with pytest.raises(ValueError, match="a100-80gb has no FP8 peak .* needs one of h100-sxm, h200$"):
        plan(cfg, a100, gpus=8, seq_len=4096, global_batch=64, precision="fp8")
    with pytest.raises(ValueError, match="precision must be one of bf16, fp8"):
        plan(cfg, H100, gpus=8, seq_len=4096, global_batch=64, precision="fp4")
    fast, slow = (plan(cfg, H100, gpus=8, seq_len=4096, global_batch=64, precision=p) for p in ("fp8", "bf16"))
    assert fast.candidates[0].cost.total < slow.candidates[0].cost.total
    recorded = plan(cfg, H100, gpus=8, seq_len=4096, global_batch=64, precision="fp8", mesh_order="tp-cp-pp-dp")
    assert {k: recorded.as_dict()[k] for k in ("precision", "mesh_order")} == dict(
        precision="fp8", mesh_order="tp-cp-pp-dp"
    )


def test_mesh_order_decides_which_axis_crosses_nodes():
    """tp4 · pp2 · dp2 on nodes of 8: Megatron's tp-cp-dp-pp keeps dp's groups in a node (span 8) and
    sends pp across nodes; Llama 3's tp-cp-pp-dp (§3.3.2) the other way round."""
    degrees = dict(dp=2, tp=4, pp=2, cp=1, ep=1)
    assert [link(H100, a, 8, "tp-cp-dp-pp", **degrees)[2] for a in ("tp", "dp", "pp")] == ["intra", "intra", "inter"]
    assert [link(H100, a, 8, "tp-cp-pp-dp", **degrees)[2] for a in ("tp", "dp", "pp")] == ["intra", "inter", "intra"]
    cfg = ModelConfig.preset("llama-3.1-8b")
    lay = LAYOUT | dict(dp=2, tp=4, pp=2, zero=1)
    meg, llama = (step_cost(cfg, H100, ep=1, seq_len=4096, mesh_order=o, **lay) for o in ("tp-cp-dp-pp", "tp-cp-pp-dp"))
    assert llama.axes["pp"][0] < meg.axes["pp"][0] and llama.axes["dp"][0] > meg.axes["dp"][0]
    assert llama.compute == meg.compute and llama.axes["tp"] == meg.axes["tp"]
    with pytest.raises(ValueError, match="mesh order must be one of tp-cp-dp-pp, tp-cp-pp-dp"):
        plan(cfg, H100, gpus=8, seq_len=4096, global_batch=64, mesh_order="pp-dp")


def test_fp8_reads_the_peak_of_the_profile_file_given_not_a_shipped_namesake(tmp_path):
    """``--hardware FILE`` with ``--precision fp8``: the FP8 peak is the file's own (issue 41, cause 6),
    whatever the file is called; a file without one is refused in one line."""
    import json

    from playbook.hardware import HARDWARE_DIR
    from playbook.theory.plan.precision import fp8_share, time_factor

    cfg = ModelConfig.preset("llama-3.1-8b")
    raw = json.loads((HARDWARE_DIR / "h100-sxm.json").read_text())
    share = fp8_share(cfg, 4096)
    for stem in ("h100-sxm", "my-h100"):  # named as a shipped profile, and not
        path = tmp_path / stem / f"{stem}.json"
        path.parent.mkdir()
        path.write_text(json.dumps(raw | {"peak_fp8_flops": 4 * raw["peak_bf16_flops"]}))
        hw = Hardware.preset(str(path))
        assert time_factor(cfg, hw, 4096, "fp8") == pytest.approx(share / 4 + 1 - share)
    bare = tmp_path / "h200.json"
    bare.write_text(json.dumps({k: v for k, v in raw.items() if k not in ("peak_fp8_flops", "fp8_source")}))
    with pytest.raises(ValueError, match="h200 has no FP8 peak in its profile"):
        time_factor(cfg, Hardware.preset(str(bare)), 4096, "fp8")
