"""The commands end to end: ``run hybrid --save`` under one layout, ``checkpoint inspect`` of what it
wrote, ``run hybrid --resume`` under another that then passes its own parity check (exit 0)."""

import json

from playbook.cli import main
from playbook.theory.checkpoint import bytes_per_rank, read_bytes
from playbook.config import ModelConfig
from playbook.dims import ParallelDims


def test_save_inspect_resume(tmp_path, capsys):
    folder = str(tmp_path / "ck")
    assert main(["run", "hybrid", "--dp", "2", "--tp", "2", "--zero", "1", "--steps", "2", "--save", folder]) == 0
    capsys.readouterr()
    assert main(["checkpoint", "inspect", folder, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["meta"]["step"] == 2 and info["meta"]["world"] == 4
    tensors = {r["tensor"]: r for r in info["tensors"]}
    assert tensors["model/tok_emb.weight"]["shape"] == [64, 64]
    assert tensors["model/blocks.0.attn.o_proj.weight"]["chunks"] > 1  # a ZeRO slice of a TP shard: rectangles
    predicted = [r["total"] for r in bytes_per_rank(ModelConfig.preset("gpt-tiny"), ParallelDims(dp=2, tp=2), zero=1)]
    assert [r["tensor_bytes"] for r in info["ranks"]] == predicted
    assert main(["checkpoint", "inspect", folder]) == 0
    text = capsys.readouterr().out
    assert "global shape" in text and "model/tok_emb.weight" in text and "64×64" in text

    argv = [
        "run",
        "hybrid",
        "--dp",
        "2",
        "--pp",
        "2",
        "--schedule",
        "interleaved",
        "--steps",
        "4",
        "--resume",
        folder,
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["losses"]) == 4 and report["parity"]["within_bounds"]
    load = report["checkpoint"]["loads"][0]
    assert load["step"] == 2
    dims = ParallelDims(dp=2, pp=2)
    saved, loading = (
        {"dims": ParallelDims(dp=2, tp=2), "zero": 1, "schedule": "1f1b", "v": 1},
        {"dims": dims, "zero": 0, "schedule": "interleaved", "v": 2},
    )
    predicted = [r["read"] for r in read_bytes(ModelConfig.preset("gpt-tiny"), saved, loading)]
    assert load["read_predicted"] == predicted == load["read_measured"]


def test_overwrite_replaces_what_the_folder_held(tmp_path, capsys):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "old.txt").write_text("an earlier run")
    assert main(["run", "hybrid", "--dp", "2", "--steps", "1", "--save", str(folder), "--overwrite", "--json"]) == 0
    capsys.readouterr()
    assert not (folder / "old.txt").exists() and (folder / "latest").read_text() == "step-1"
    assert main(["checkpoint", "inspect", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["step"] == 1
