"""``playbook plan --topology`` and ``serve-plan --topology`` (``cli.plan_topology``)."""

import json

import pytest

from playbook.cli import main
from playbook.theory.plan.placed import placement_of
from playbook.theory.topology import load_topology

WS = ["--model", "llama-3.1-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "32"]


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_json_records_the_placement(capsys):
    code, out, _ = run(capsys, "plan", *WS, "--topology", "pcie-workstation", "--top", "3", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["topology"] == "pcie-workstation" and len(d["mesh_orders"]) == 6
    ws = load_topology("pcie-workstation")
    for c in d["candidates"]:  # the placement recorded is the one the layout and its order give
        want = {a: w["outermost"] for a, w in placement_of(ws, _layout(c), c["mesh_order"]).items()}
        assert c["placement"] == want and c["placement"]
    assert set(d["crossings"]) == {"pcie-switch", "socket", "upi"}
    steps = [c["step_s"] for c in d["candidates"]]
    assert steps == sorted(steps)


def _layout(c):
    from playbook.theory.plan.search import Layout

    keys = ("dp", "tp", "pp", "cp", "ep", "zero", "micro_batch", "microbatches", "recompute", "schedule", "v", "ends")
    return Layout(**{k: c[k] for k in keys})


def test_plan_table_and_one_layout(capsys):
    code, out, _ = run(
        capsys, "plan", *WS, "--topology", "pcie-workstation", "--mesh-order", "tp-cp-pp-dp", "--top", "2"
    )
    assert code == 0 and "topology pcie-workstation" in out and "mesh orders searched: tp-cp-pp-dp" in out
    code, out, _ = run(capsys, "plan", *WS, "--topology", "pcie-workstation", "--layout", "dp=4 tp=2 zero=2 b=2")
    assert code == 0 and "placement (tp-cp-dp-pp): tp: pcie-switch, dp: upi" in out
    code, out, _ = run(
        capsys, "plan", *WS, "--topology", "pcie-workstation", "--layout", "dp=4 tp=2 zero=2 b=2", "--json"
    )
    assert json.loads(out)["placement"] == {"tp": "pcie-switch", "dp": "upi"}


def test_serve_plan_on_a_topology(capsys):
    code, out, _ = run(
        capsys, "serve-plan", "--model", "llama-3.1-8b", "--gpus", "8", "--topology", "pcie-workstation", "--json"
    )
    d = json.loads(out)
    assert code == 0 and d["placement"]["tp8×dp1"] == {"tp": "upi"} and d["recommended"] in d["placement"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", *WS, "--topology", "nope"], "unknown topology 'nope'; known topologies: dgx-h100-rail"),
        (["plan", *WS, "--mesh-order", "cp-tp-dp-pp"], "--mesh-order cp-tp-dp-pp needs --topology"),
        (
            ["plan", *WS, "--gpus", "16", "--topology", "pcie-workstation"],
            "more than topology 'pcie-workstation' holds (8)",
        ),
        (["plan", *WS, "--topology", "pcie-workstation", "--gpus-per-node", "4"], "the topology sets it (8"),
        (["serve-plan", "--model", "llama-3.1-8b", "--gpus", "16", "--topology", "pcie-workstation"], "holds (8)"),
    ],
)
def test_bad_topology_input_is_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code != 0 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_help_documents_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "--topology FILE" in capsys.readouterr().out
