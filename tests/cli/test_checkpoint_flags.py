"""``run hybrid --save / --save-every / --resume / --overwrite`` and ``checkpoint inspect``: bad input is
one ``playbook: error:`` line before any rank starts (exit 2), and nothing on disk changes."""

from __future__ import annotations

import json

import pytest

from playbook.cli import main


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err, err
    return err


def fake_checkpoint(folder, model="gpt-tiny", step=2, **setup):
    """A checkpoint folder's playbook.json alone: what the checks read before any rank starts."""
    ck = folder / "step-2"
    ck.mkdir(parents=True)
    meta = {
        "model": model,
        "world": 2,
        "step": step,
        "losses": [],
        "layout": {"dp": 2, "tp": 1, "pp": 1, "cp": 1, "ep": 1},
    }
    meta["setup"] = {"model": model, "global_batch": 8, "seq_len": 32, **setup}
    (ck / "playbook.json").write_text(json.dumps(meta))
    (folder / "latest").write_text("step-2")
    return folder


RUN = ["run", "hybrid", "--dp", "2", "--steps", "4"]


def test_resume_of_a_missing_folder(capsys, tmp_path):
    err = one_line(capsys, [*RUN, "--resume", str(tmp_path / "nope")])
    assert "no such folder" in err


def test_resume_of_a_folder_without_a_checkpoint(capsys, tmp_path):
    assert "no checkpoint there" in one_line(capsys, [*RUN, "--resume", str(tmp_path)])


def test_resume_of_another_models_checkpoint(capsys, tmp_path):
    fake_checkpoint(tmp_path, model="gpt-tiny-moe")
    err = one_line(capsys, [*RUN, "--resume", str(tmp_path)])
    assert "a checkpoint of gpt-tiny-moe, and --model is gpt-tiny; pass --model gpt-tiny-moe" in err


def test_resume_with_another_batch_or_no_steps_left(capsys, tmp_path):
    fake_checkpoint(tmp_path / "a", global_batch=16)
    assert "pass --global-batch 16" in one_line(capsys, [*RUN, "--resume", str(tmp_path / "a")])
    fake_checkpoint(tmp_path / "b", step=4)
    assert "nothing left to run; pass --steps 5" in one_line(capsys, [*RUN, "--resume", str(tmp_path / "b")])


def test_save_into_a_non_empty_folder_needs_overwrite_and_nothing_is_touched(capsys, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    err = one_line(capsys, [*RUN, "--save", str(tmp_path)])
    assert "not empty" in err and "--overwrite" in err
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("flag", [["--save-every", "2"], ["--overwrite"], ["--async-save"]])
def test_save_options_need_save(capsys, flag):
    assert "needs --save DIR" in one_line(capsys, [*RUN, *flag])


def test_save_every_must_be_positive(capsys, tmp_path):
    assert "--save-every must be a positive" in one_line(
        capsys, [*RUN, "--save", str(tmp_path / "x"), "--save-every", "0"]
    )


def test_inspect_refuses_a_missing_or_empty_folder(capsys, tmp_path):
    assert "no such folder" in one_line(capsys, ["checkpoint", "inspect", str(tmp_path / "nope")])
    assert "no checkpoint there" in one_line(capsys, ["checkpoint", "inspect", str(tmp_path)])
