"""Issue 31, input: every bad file or value gets one ``playbook: error:`` line (exit 2) naming
the file, the field and what would work; never a traceback, a hang or nonsense."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from playbook.cli import main
from playbook.config import DATA_DIR

H100 = json.loads((DATA_DIR / "hardware" / "h100-sxm.json").read_text())
LLAMA = json.loads((DATA_DIR / "hf" / "Llama-3.1-8B.json").read_text())
DEEPSEEK = json.loads((DATA_DIR / "hf" / "DeepSeek-V3.json").read_text())


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _file(tmp_path: Path, name: str, content) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


@pytest.mark.parametrize(
    "content, expected",
    [
        ([1, 2], "holds a JSON list; a hardware profile is one JSON object"),
        ({"name": "x"}, "lacks memory_bytes, peak_bf16_flops"),
        ({**H100, "memory_bandwidth": "fast"}, "memory_bandwidth must be a number greater than 0"),
        ({**H100, "memory_bytes": -1}, "memory_bytes must be a number greater than 0 and at most 1e+15, got -1"),
        ({**H100, "devices_per_node": 0}, "devices_per_node must be a positive integer at most 1,024, got 0"),
        ({**H100, "memory_bytes": 10**400}, "memory_bytes must be a number"),
        ({**H100, "collectives": [1]}, "collectives must be a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "nests too deep to read"),
    ],
)
def test_hardware_profile_files_are_checked(tmp_path, capsys, content, expected):
    path = _file(tmp_path, "hw.json", content)
    err = one_line(capsys, ["serve-plan", "--hardware", path])
    assert expected in err and "hw.json" in err


def test_unreadable_and_folder_profiles(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "dir.json"
    folder.mkdir()
    assert "is a folder" in one_line(capsys, ["serve-plan", "--hardware", str(folder)])
    path = _file(tmp_path, "locked.json", H100)

    read = Path.read_text

    def refuse(self, *a, **k):  # chmod 000 does not stop root, so the refusal is simulated
        if self.name == "locked.json":
            raise PermissionError(13, "Permission denied", str(self))
        return read(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", refuse)
    assert "cannot read hardware profile" in one_line(capsys, ["serve-plan", "--hardware", path])
    assert "Permission denied" in one_line(capsys, ["plan", "--hf-config", path, "--gpus", "8"])


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["serve-plan", "--model", "../hardware/h100-sxm"], "unknown model preset '../hardware/h100-sxm' (tried as"),
        (["serve-plan", "--hardware", "../models/gpt-tiny"], "(tried as a preset name, not as a path)"),
        (["memory", "--model", "../models/gpt-tiny"], "known model presets: "),
    ],
)
def test_a_preset_name_is_not_a_path(capsys, argv, expected):
    assert expected in one_line(capsys, argv)


@pytest.mark.parametrize(
    "base, change, expected",
    [
        (LLAMA, {"rope_theta": None}, "rope_theta must be a number greater than 0"),
        (LLAMA, {"rope_theta": [1]}, "rope_theta must be a number"),
        (LLAMA, {"rope_theta": "fast"}, "rope_theta must be a number greater than 0 and at most 1e+15, got 'fast'"),
        (LLAMA, {"rms_norm_eps": None}, "rms_norm_eps must be a number greater than 0 and at most 1, got null"),
        (LLAMA, {"rope_scaling": "linear"}, "rope_scaling must be a JSON object or null, got 'linear'"),
        (LLAMA, {"num_hidden_layers": 10**400}, "num_hidden_layers must be a positive integer at most 10,000"),
        (LLAMA, {"num_hidden_layers": 10**9}, "num_hidden_layers must be a positive integer at most 10,000"),
        (DEEPSEEK, {"n_shared_experts": "two"}, "n_shared_experts must be an integer at least 0"),
        (DEEPSEEK, {"q_lora_rank": -5}, "q_lora_rank must be a positive integer at most 1,000,000, got -5"),
    ],
)
def test_hf_config_fields_are_checked(tmp_path, capsys, base, change, expected):
    path = _file(tmp_path, "cfg.json", {**base, **change})
    err = one_line(capsys, ["plan", "--hf-config", path, "--gpus", "8"])
    assert expected in err and "cfg.json" in err


def test_hf_config_nested_too_deep(tmp_path, capsys):
    path = _file(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    assert "nests too deep to read" in one_line(capsys, ["plan", "--hf-config", path])


def test_model_config_bounds_every_field():
    from playbook.config import ModelConfig

    base = dict(vocab_size=256, hidden=64, n_layers=2, n_heads=4, ffn_hidden=128, max_seq_len=32)
    with pytest.raises(ValueError, match="q_lora_rank must be an integer at least 0"):
        ModelConfig(**base, q_lora_rank=-5)
    with pytest.raises(ValueError, match="n_layers must be a positive integer at most 10,000"):
        ModelConfig(**{**base, "n_layers": 10**9})
    with pytest.raises(ValueError, match="rope_theta must be a number greater than 0"):
        ModelConfig(**base, rope_theta=float("nan"))


# ---- calibrate --out: checked before measuring, the measurement kept if writing still fails ------
def _fake_calibrate(monkeypatch, calls):
    import playbook.measure.calibrate as calibrate

    def fake(ranks, quick=False):
        calls.append(ranks)
        return {"name": "fake", "measured": True}

    monkeypatch.setattr(calibrate, "calibrate", fake)


def test_calibrate_refuses_a_folder_before_measuring(tmp_path, capsys, monkeypatch):
    calls = []
    _fake_calibrate(monkeypatch, calls)
    folder = tmp_path / "out.json"
    folder.mkdir()
    assert "is a folder; name a file in it" in one_line(capsys, ["calibrate", "--out", str(folder)])
    assert calls == []


def test_calibrate_keeps_the_measurement_when_writing_fails(tmp_path, capsys, monkeypatch):
    calls = []
    _fake_calibrate(monkeypatch, calls)
    out = tmp_path / "cal.json"
    write = Path.write_text

    def full_disk(self, *a, **k):
        if self == out:
            raise OSError(28, "No space left on device")
        return write(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    err = one_line(capsys, ["calibrate", "--out", str(out)])
    assert calls == [2] and "No space left on device" in err
    kept = Path(err.split("the measurement is kept in ")[1])
    assert json.loads(kept.read_text())["measured"] is True
    kept.unlink()


# ---- a hardware profile with a wrong type in EVERY field, nested ones too -----------------------
CALIBRATED = json.loads((DATA_DIR / "measurements" / "cpu-2core" / "profile.json").read_text())
EVERY_FIELD = {**CALIBRATED, **{k: v for k, v in H100.items() if k not in CALIBRATED}}  # calibrate's and a datasheet's


def _leaves(value, path=()):
    """(path, value) of every field, and of the first item of each list (the others are alike)."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list) and value:
        yield from _leaves(value[0], (*path, 0))


def _wrong(value):
    """A value of another JSON type: text for a number, a number for text, and so on."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return 3
    return 5 if isinstance(value, list) else [1]


def _with(profile: dict, path: tuple, new) -> dict:
    out = json.loads(json.dumps(profile))
    here = out
    for key in path[:-1]:
        here = here[key]
    here[path[-1]] = new
    return out


FIELDS = [path for path, _ in _leaves(EVERY_FIELD) if path]


def test_every_field_is_reached():
    assert len(FIELDS) > 60 and ("collectives", "all_reduce", "points", 0, "seconds") in FIELDS
    assert ("matmul", 0, "flops_per_s") in FIELDS and ("load_average", "before", 0) in FIELDS


@pytest.mark.parametrize("path", FIELDS, ids=[".".join(map(str, p)) for p in FIELDS])
def test_a_wrong_type_in_any_hardware_field_is_one_line(tmp_path, capsys, path):
    value = EVERY_FIELD
    for key in path:
        value = value[key]
    bad = _with(EVERY_FIELD, path, _wrong(value))
    err = one_line(
        capsys, ["plan", "--model", "gpt-tiny", "--gpus", "2", "--hardware", _file(tmp_path, "hw.json", bad)]
    )
    name = next(k for k in reversed(path) if isinstance(k, str))  # the field named, e.g. alpha or before
    assert name in err and "hw.json" in err, err


def test_the_profile_with_every_field_is_itself_accepted(tmp_path, capsys):
    path = _file(tmp_path, "hw.json", EVERY_FIELD)
    assert main(["serve-plan", "--model", "gpt-tiny", "--gpus", "2", "--hardware", path, "--context", "32"]) == 0


# ---- every --layout key at 0, and a schedule's v, refused in one line before any costing ---------
LAYOUT = "dp=8 tp=2 pp=4 m=64"
LAYOUT_KEYS = ["dp", "tp", "pp", "cp", "ep", "b", "m"]


@pytest.mark.parametrize("key", LAYOUT_KEYS)
@pytest.mark.parametrize("value", [0, -2])
def test_every_layout_key_at_zero_is_one_line(capsys, key, value):
    layout = " ".join(p for p in LAYOUT.split() if not p.startswith(f"{key}=")) + f" {key}={value}"
    err = one_line(capsys, ["plan", "--model", "llama-3.1-8b", "--gpus", "64", "--layout", layout])
    assert f"{key} must be a positive integer, got {key}={value}" in err, err


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            "schedule=interleaved",
            "schedule=interleaved needs pp >= 2 and v >= 2 model chunks per rank, got pp=4 v=(none)",
        ),
        ("schedule=interleaved v=0", "got pp=4 v=0; e.g. pp=4 v=2"),
        ("schedule=interleaved v=1", "got pp=4 v=1"),
        ("v=0", "schedule=1f1b holds v=1 model chunks per rank, got v=0; omit v"),
        ("schedule=zb-v v=0", "schedule=zb-v holds v=2"),
        ("schedule=dualpipe-v v=3", "schedule=dualpipe-v holds v=2"),
    ],
)
def test_a_schedule_without_its_v_is_one_line(capsys, extra, expected):
    err = one_line(capsys, ["plan", "--model", "llama-3.1-8b", "--gpus", "64", "--layout", f"{LAYOUT} {extra}"])
    assert expected in err, err


def test_interleaved_on_one_stage_is_refused(capsys):
    err = one_line(
        capsys,
        ["plan", "--model", "llama-3.1-8b", "--gpus", "64", "--layout", "dp=8 tp=8 m=64 schedule=interleaved v=2"],
    )
    assert "got pp=1 v=2; e.g. pp=2 v=2" in err


def test_a_v_shape_takes_its_two_chunks_by_itself():
    from playbook.theory.plan.layout import parse_layout

    assert parse_layout(f"{LAYOUT} schedule=zb-v", global_batch=512).v == 2
    assert parse_layout(f"{LAYOUT} schedule=interleaved v=4", global_batch=512).v == 4
    assert parse_layout(LAYOUT, global_batch=512).v == 1


# ---- every output path: checked before the work, a write failure in one line ---------------------
def _bad_paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, what the one line says)."""
    import os

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # writing it would block until a reader comes: the hang the sweep found
    folder = tmp_path / "out.json"
    folder.mkdir()
    plain = tmp_path / "plain"
    plain.write_text("")  # a file where the folder should be
    return {
        "a file for a folder": (str(plain / "x.json"), "is a file, not a folder"),
        "300-character name": (str(tmp_path / ("a" * 295 + ".json")), "more than the 255 this file system allows"),
        "missing folder": (str(tmp_path / "no" / "such" / "x.json"), "does not exist; create it first"),
        "a folder": (str(folder), "is a folder; name a file in it"),
        "a fifo": (str(fifo), "is not a regular file"),
        "a device": ("/dev/full", "is not a regular file"),
        "/proc": ("/proc/x.json", "is inside /proc, the kernel's interface"),
        "/sys": ("/sys/kernel/x.json", "is inside /sys, the kernel's interface"),
        "unwritable": ("/proc/self/x.json", "is inside /proc"),
    }


BAD_PATHS = [
    "300-character name",
    "missing folder",
    "a file for a folder",
    "a folder",
    "a fifo",
    "a device",
    "/proc",
    "/sys",
    "unwritable",
]


@pytest.mark.parametrize("case", BAD_PATHS)
def test_trace_paths_are_checked_before_any_rank_starts(tmp_path, capsys, case):
    path, expected = _bad_paths(tmp_path)[case]
    err = one_line(capsys, ["run", "single", "--world-size", "1", "--trace", path])
    assert expected in err and "--trace" in err, err


@pytest.mark.parametrize("case", BAD_PATHS)
def test_calibrate_out_paths_are_checked_before_measuring(tmp_path, capsys, monkeypatch, case):
    calls = []
    _fake_calibrate(monkeypatch, calls)
    path, expected = _bad_paths(tmp_path)[case]
    err = one_line(capsys, ["calibrate", "--out", path])
    assert (expected in err or "must name a .json file" in err) and calls == [], err


@pytest.mark.parametrize("case", BAD_PATHS)
def test_serve_bench_out_paths_are_checked_before_any_rank_starts(tmp_path, capsys, monkeypatch, case):
    """Issue 48's sweep, every output path unwritable: serve-bench's --out too (only a missing folder
    was tried), refused in one line before the trace is drawn or a rank starts."""
    import playbook.serve.serve_bench as bench

    calls = []
    monkeypatch.setattr(bench, "serve_bench", lambda *a, **k: calls.append(a) or {})
    path, expected = _bad_paths(tmp_path)[case]
    err = one_line(capsys, ["serve-bench", "--out", path])
    assert (expected in err or "must name a .json file" in err) and "--out" in err and calls == [], err


def test_calibrate_checks_the_step_time_table_s_name_too(tmp_path, capsys, monkeypatch):
    calls = []
    _fake_calibrate(monkeypatch, calls)
    path = str(tmp_path / ("a" * 245 + ".json"))  # fits; its "-step-time.json" sibling does not
    err = one_line(capsys, ["calibrate", "--out", path, "--step-time"])
    assert "written beside it" in err and calls == [], err
    assert not any(tmp_path.iterdir())  # the probe left nothing behind


def test_a_checked_path_is_left_as_it_was(tmp_path):
    from playbook.validate import check_output_path

    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("kept")
    assert check_output_path("--out", str(new), "x.json") == new and not new.exists()
    check_output_path("--out", str(old), "x.json")
    assert old.read_text() == "kept"


def test_a_write_that_fails_at_the_end_is_one_line_and_leaves_the_old_file(tmp_path, capsys, monkeypatch):
    import os

    from playbook.cli.trace import write_trace

    out = tmp_path / "run.json"
    out.write_text("old")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    traces = [[{"rank": 0, "kind": "compute", "name": "step", "start": 0.0, "end": 1.0}]]
    with pytest.raises(ValueError, match=r"could not write --trace .*No space left on device"):
        write_trace(str(out), "t", traces)
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_written_output_has_the_mode_open_would_give_it(tmp_path):
    import os

    from playbook.validate import write_output

    write_output("--out", tmp_path / "x.json", "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_writing_never_replaces_a_device_or_a_pipe(tmp_path):
    """write_output renames a finished file into place; over a FIFO (or /dev/full) that rename would
    swap the node for a regular file, so the write refuses even when its caller skipped the check."""
    import os

    from playbook.validate import write_output

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is not a regular file; nothing was written"):
        write_output("--out", fifo, "{}")
    assert fifo.is_fifo() and [p.name for p in tmp_path.iterdir()] == ["pipe"]
