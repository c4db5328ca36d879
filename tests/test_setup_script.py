"""``./setup.sh test``'s own logic, with stand-ins for pytest and ruff (each run takes a second): nbmake
runs beside the tests, its output comes after theirs, and the exit status is the tests' or else
nbmake's (its "no test collected", exit 5, counts as a pass: ``./setup.sh test -k cluster``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

STUB = r"""#!/usr/bin/env bash
case "$*" in
  *hashlib*) exec "$REAL_PYTHON" "$@" ;;
  *why_not_here*) echo ""; exit 0 ;;  # the browser is here
  *--nbmake*) echo "nbmake from $(date +%s.%N)"; sleep "$NB_SECONDS"; echo "nbmake says $NB_RC"; exit "$NB_RC" ;;
  *"-m pytest tests"*) echo "tests from $(date +%s.%N)"; sleep 1; echo "tests say $TESTS_RC"; exit "$TESTS_RC" ;;
esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path):
    """setup.sh and pyproject.toml in a folder whose venv is set up already and holds stand-ins."""
    for name in ("setup.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export PATH="{venv}:$PATH"\n')
    for tool in ("python", "ruff"):
        (venv / tool).write_text(STUB)
        (venv / tool).chmod(0o755)
    digest = hashlib.sha256((tmp_path / "pyproject.toml").read_bytes()).hexdigest()
    (tmp_path / ".venv" / ".playbook-setup").write_text(f"{digest} {sys.version.split()[0]}\n")
    return tmp_path


def run(checkout: Path, tests_rc: int, nb_rc: int, nb_seconds: float = 2.0):
    env = {**os.environ, "REAL_PYTHON": sys.executable, "TESTS_RC": str(tests_rc), "NB_RC": str(nb_rc)}
    env.update(NB_SECONDS=str(nb_seconds), PLAYBOOK_VENV=".venv")
    env.pop("CI", None)
    return subprocess.run(
        ["bash", "setup.sh", "test"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )


def started(out: str, what: str) -> float:
    return float(next(line for line in out.splitlines() if line.startswith(f"{what} from ")).split()[-1])


def test_nbmake_runs_beside_the_tests_and_reports_after_them(checkout):
    t0 = time.monotonic()
    done = run(checkout, 0, 0, nb_seconds=2.0)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert abs(started(out, "nbmake") - started(out, "tests")) < 1.0  # started together, not one after the other
    assert time.monotonic() - t0 < 1 + 2 + 5
    assert out.index("tests say 0") < out.index("nbmake from") < out.index("stage times:")
    assert "nbmake after the tests" in out.splitlines()[-1] and "load average" in out.splitlines()[-1]


@pytest.mark.parametrize(
    "tests_rc,nb_rc,want",
    [(1, 0, 1), (0, 1, 1), (0, 5, 0), (1, 1, 1)],
    ids=["tests fail", "a chapter fails", "no chapter selected", "both fail"],
)
def test_the_exit_status_is_the_tests_or_else_nbmakes(checkout, tests_rc, nb_rc, want):
    done = run(checkout, tests_rc, nb_rc, nb_seconds=0.5)
    assert done.returncode == want, done.stdout + done.stderr
    assert f"nbmake says {nb_rc}" in done.stdout  # waited for, and shown, whatever the tests said
