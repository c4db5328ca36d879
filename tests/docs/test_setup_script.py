"""``./setup.sh test``'s own logic, with stand-ins for pytest and ruff (each run takes a fraction of a second):
three pytest runs side by side (the chapters in the browser and the book; the other tests; nbmake), their
outputs one after the other, and the exit status of the first that failed (a run that selected nothing,
exit 5, counts as a pass unless none selected anything: ``./setup.sh test -k cluster``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = r"""#!/usr/bin/env bash
say() {
  echo "$1 from $(date +%s.%N)"
  "$REAL_PYTHON" -c "import signal; print('$1 stops on Ctrl-C:', signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
  sleep "$2"; echo "$1 says $3 at $(date +%s.%N)"; exit "$3"
}
case "$*" in
  *hashlib*) exec "$REAL_PYTHON" "$@" ;;
  *why_not_here*) echo ""; exit 0 ;;  # the browser is here
  *"jupyter lab"*) echo "jupyter lab with: $*"; exit 0 ;;
  *"import torch"*) [ -n "${NO_TORCH:-}" ] && exit 1; exit 0 ;;
  *--nbmake*) say nbmake "$SLEEP" "$NB_RC" ;;
  *--ignore=tests/book/test_book.py*) say others "$SLEEP" "$OTHERS_RC" ;;
  *"tests/browser tests/book/test_book.py"*) say chapters "$SLEEP" "$CHAPTERS_RC" ;;
esac
exit 0
"""


# pip: an index named in UNREACHABLE fails as an unreachable one does; everything else installs
PIP = r"""#!/usr/bin/env bash
for a in "$@"; do
  if [ -n "${UNREACHABLE:-}" ] && [ "$a" = "$UNREACHABLE" ]; then
    echo "WARNING: Retrying ... NewConnectionError" >&2; echo "ERROR: No matching distribution found for torch" >&2; exit 1
  fi
done
echo "pip $*" >> "$PIP_LOG"; exit 0
"""
ID = r"""#!/usr/bin/env bash
[ "$1" = -u ] && { echo "${FAKE_UID:-1000}"; exit 0; }
exec /usr/bin/id "$@"
"""


@pytest.fixture
def checkout(tmp_path):
    """setup.sh and pyproject.toml in a folder whose venv is set up already and holds stand-ins."""
    for name in ("setup.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export PATH="{venv}:$PATH"\n')
    for tool, text in (("python", STUB), ("ruff", STUB), ("pip", PIP), ("id", ID)):
        (venv / tool).write_text(text)
        (venv / tool).chmod(0o755)
    digest = hashlib.sha256((tmp_path / "pyproject.toml").read_bytes()).hexdigest()
    (tmp_path / ".venv" / ".playbook-setup").write_text(f"{digest} {sys.version.split()[0]}\n")
    return tmp_path


def run(checkout: Path, chapters: int, others: int, nbmake: int, sleep: float = 0.05):
    """setup.sh test with each stand-in run sleeping ``sleep`` seconds, then exiting with its code."""
    env = {**os.environ, "REAL_PYTHON": sys.executable, "PLAYBOOK_VENV": ".venv", "SLEEP": str(sleep)}
    env.update(CHAPTERS_RC=str(chapters), OTHERS_RC=str(others), NB_RC=str(nbmake))
    env.pop("CI", None)
    return subprocess.run(
        ["bash", "setup.sh", "test"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )


def started(out: str, what: str) -> float:
    return float(next(line for line in out.splitlines() if line.startswith(f"{what} from ")).split()[-1])


def ended(out: str, what: str) -> float:
    return float(next(line for line in out.splitlines() if line.startswith(f"{what} says ")).split()[-1])


def test_the_three_runs_start_together_and_report_one_after_the_other(checkout):
    done = run(checkout, 0, 0, 0, sleep=1.5)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    runs = ("chapters", "others", "nbmake")
    # side by side: every run started before any ended (one after the other, each would start after an end)
    assert max(started(out, w) for w in runs) < min(ended(out, w) for w in runs), out
    order = [out.index(text) for text in ("chapters says", "others from", "others says", "nbmake from", "stage times:")]
    assert order == sorted(order), out
    assert "load average" in out.splitlines()[-1]
    for what in ("chapters", "others", "nbmake"):  # bash ignores SIGINT in what it starts with &, unless told
        assert f"{what} stops on Ctrl-C: True" in out


@pytest.mark.parametrize(
    "codes,want",
    [((1, 0, 0), 1), ((0, 1, 0), 1), ((0, 0, 1), 1), ((0, 2, 1), 2), ((5, 0, 5), 0), ((5, 5, 5), 5)],
    ids=["chapters fail", "a test fails", "a chapter fails under nbmake", "the first failure", "-k", "none selected"],
)
def test_the_exit_status_is_the_first_failure(checkout, codes, want):
    done = run(checkout, *codes)
    assert done.returncode == want, done.stdout + done.stderr
    for what, code in zip(("chapters", "others", "nbmake"), codes):
        assert f"{what} says {code}" in done.stdout  # each waited for and shown, whatever the others said


def lab(checkout: Path, **env) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "REAL_PYTHON": sys.executable,
        "PLAYBOOK_VENV": ".venv",
        "PIP_LOG": str(checkout / "pip.log"),
        **env,
    }
    for inherited in ("PLAYBOOK_TORCH_INDEX", "PLAYBOOK_TORCH"):  # CI sets both; each test names its own
        env.pop(inherited, None)
    return subprocess.run(
        ["bash", "setup.sh", "lab"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("uid, root", [("0", True), ("1000", False)])
def test_lab_passes_allow_root_to_jupyter_only_for_root_and_says_so(checkout, uid, root):
    done = lab(checkout, FAKE_UID=uid)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("--allow-root" in done.stdout.split("jupyter lab with:")[-1]) == root
    assert ("running as root" in done.stdout) == root
    assert ".venv/bin/playbook" in done.stdout  # where the CLI is


def test_an_unreachable_cpu_index_is_one_line_and_the_fallback_it_takes(checkout):
    (checkout / ".venv" / ".playbook-setup").unlink()  # pip runs
    done = lab(checkout, NO_TORCH="1", UNREACHABLE="https://download.pytorch.org/whl/cpu", FAKE_UID="1000")
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "unreachable" in line]
    assert len(said) == 1 and "PLAYBOOK_TORCH_INDEX" in said[0] and "usual index" in said[0], done.stdout
    assert "Retrying" not in done.stdout + done.stderr  # pip's retries stay in the log file
    installs = (checkout / "pip.log").read_text().splitlines()
    assert "--index-url" not in installs[0] and installs[0].endswith("torch"), installs  # the fallback install
