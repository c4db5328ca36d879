"""``--quantize`` and ``--kv-dtype`` on ``playbook run serve`` and ``serve-bench``: documented, and refused in one line."""

import pytest

from playbook.cli import main


@pytest.mark.parametrize("command", [["run", "serve"], ["serve-bench"]])
def test_the_flags_are_in_the_help(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert "--quantize {int8,fp8}" in out and "--kv-dtype {fp32,bf16,fp16,int8,fp8}" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve-bench", "--model", "gpt-tiny-moe", "--quantize", "int8"], "--quantize int8 covers dense models"),
        (["run", "serve", "--ep", "2", "--model", "gpt-tiny-moe", "--kv-dtype", "fp8"], "not --pp/--ep"),
    ],
)
def test_unsupported_combinations_are_refused_before_any_rank(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
