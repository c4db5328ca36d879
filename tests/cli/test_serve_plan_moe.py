"""``playbook serve-plan`` on a mixture of experts: the MoE layouts' table, which wins where, and
``--attention-dp``'s refusals in one line."""

import json

from playbook.cli import main


def _json(capsys, *argv) -> dict:
    assert main(["serve-plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_deepseek_v3_on_h200_recommends_dp_attention_and_says_why(capsys):
    assert (
        main(
            [
                "serve-plan",
                "--model",
                "deepseek-v3",
                "--gpus",
                "8",
                "--hardware",
                "h200",
                "--dtype",
                "fp8",
                "--attention-dp",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "MoE recommended: DP attention" in out and "copies of other ranks' KV" in out
    assert "--attention-dp:" in out and "(the best here)" in out


def test_mixtral_tp_attention_is_the_dense_tables_tp8_replica(capsys):
    """TP attention with the experts' outputs all-reduced is tensor parallelism of the whole model:
    the same weights, KV room and sequences as the tp8 × dp1 row (computed by theory.serving.layouts)."""
    d = _json(capsys, "--model", "mixtral-8x7b", "--gpus", "8")
    tp8 = next(r for r in d["layouts"] if r["tp"] == 8)
    tp_attn = next(r for r in d["moe_layouts"] if r["layout"] == "TP attention")
    assert tp_attn["seqs"] == tp8["seqs"]
    assert abs(tp_attn["weights_per_gpu"] - tp8["weights_per_gpu"]) < 1e-3 * tp8["weights_per_gpu"]
    assert abs(tp_attn["tokens_per_s"] - tp8["tokens_per_s"]) < 0.01 * tp8["tokens_per_s"]


def test_attention_dp_refuses_a_dense_model_and_an_ep_not_dividing_the_experts(capsys):
    for argv, words in (
        (["--model", "llama-3.1-70b"], "dense model"),
        (["--model", "mixtral-8x7b", "--gpus", "16"], "ep=16 does not divide the 8 experts"),
        (["--model", "deepseek-v3", "--gpus", "8"], "leave no room for one 8192-token sequence"),
    ):
        assert main(["serve-plan", "--attention-dp", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("playbook: error: --attention-dp: ") and "\n" not in err and words in err, err
