"""``--speculative K --draft MODEL`` on ``playbook run serve`` and ``serve-bench``: bad combinations
refused in one line before any rank starts (exit 2)."""

import pytest

from playbook.cli import main


@pytest.mark.parametrize(
    "command, flags, message",
    [
        (["run", "serve"], ["--speculative", "40"], "--speculative 40 must be 1..16 draft tokens per step"),
        (["run", "serve"], ["--draft", "self:1"], "--draft self:1 drafts for speculative decoding; add --speculative"),
        (["run", "serve"], ["--speculative", "2", "--draft", "gpt-small"], "vocabulary of 128 tokens, gpt-tiny of 64"),
        (["run", "serve"], ["--speculative", "2", "--draft", "self:2"], "1 <= E < 2 (gpt-tiny has 2)"),
        (["run", "serve"], ["--pp", "2", "--speculative", "2"], "not with --pp or --ep"),
        (
            ["run", "serve"],
            ["--speculative", "3", "--token-budget", "10"],
            "must exceed --max-batch 4 × (--speculative 3 + 1)",
        ),
        (["serve-bench"], ["--speculative", "2", "--draft", "self:9"], "1 <= E < 2"),
        (["serve-bench"], ["--speculative", "-1"], "--speculative -1 must be 1..16"),
    ],
)
def test_speculative_flags_refused_in_one_line(capsys, command, flags, message):
    assert main([*command, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
