"""Every command in the README's code blocks runs as printed (or is skipped here with the reason)."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

# Commands that cannot run inside a test, and why.
SKIP = {
    "./setup.sh": "creates a virtual environment / opens JupyterLab / runs the whole suite: the suite is what runs this",
    "torchrun --nnodes 2": "needs two hosts; tests/cluster/test_cluster.py runs the same rank code under torchrun --standalone",
}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def shell_commands() -> list[str]:
    """One command per logical line (backslash continuations joined), comments dropped."""
    commands = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                commands.append(line)
    return commands


def test_the_readme_has_the_commands_this_test_expects():
    commands = shell_commands()
    assert sum(c.startswith("playbook run ") for c in commands) >= 8
    assert any(c.startswith("torchrun") for c in commands) and len(blocks("python")) == 1


def readme_commands() -> list:
    """The commands as parameters, ``playbook run`` ones in the ``ranks`` tier (they start ranks)."""
    return [pytest.param(c, marks=pytest.mark.ranks) if c.startswith("playbook run ") else c for c in shell_commands()]


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_runs_as_printed(command, capsys):
    from playbook.cli import main

    for prefix, reason in SKIP.items():
        if command.startswith(prefix):
            pytest.skip(reason)
    argv = shlex.split(command)
    assert argv[0] == "playbook", f"a README command this test does not know how to run: {command}"
    code = main(argv[1:])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "PARITY FAILED" not in out.out


@pytest.mark.ranks
def test_the_readme_notebook_example_gives_what_it_says():
    from playbook.cluster.launch import _shared

    code = blocks("python")[0]
    expected = re.search(r"ranks\(4\)\.run\(total\)\s+# -> (.*)", code)[1]
    namespace = {"__name__": "__main__"}
    saved = _shared.pop("ranks", None)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, namespace)
            result = eval("ranks(4).run(total)", namespace)
        assert result == eval(expected)
    finally:
        r = _shared.pop("ranks", None)
        if r is not None:
            r.stop()
        if saved is not None:
            _shared["ranks"] = saved
