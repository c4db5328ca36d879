#!/usr/bin/env bash
# Set up a virtual environment (once) and then either open the notebooks or run every test.
#
#   ./setup.sh lab [ARGS...]    JupyterLab on the chapters (the main job; ARGS go to jupyter lab)
#   ./setup.sh test [ARGS...]   lint, then every test (the chapters in a browser, the book) and pytest --nbmake notebooks/, side by side
#   ./setup.sh book             run every chapter and build the static book in build/book/ (no kernel to read it)
#
# Without a GPU it installs PyTorch's CPU build first, so pip does not pull a multi-GB CUDA build.
# PLAYBOOK_TORCH (a pip requirement, default "torch") and PLAYBOOK_TORCH_INDEX (default: PyTorch's
# CPU wheel index when there is no GPU; empty for pip's usual index) choose another build.
# pip runs only when pyproject.toml changed since the last successful setup (a stamp in the venv).
# The JupyterLab browser tests (tests/browser) run when Chromium and Playwright are present, and then
# they are what executes the chapters (else tests/book/test_book.py does); under CI=true their absence is an error.
set -euo pipefail
cd "$(dirname "$0")"
venv="${PLAYBOOK_VENV:-.venv}"
what="${1:-}"
case "$what" in lab|test|book) shift ;; *) echo "usage: ./setup.sh lab [jupyter args] | test [pytest args] | book" >&2; exit 2 ;; esac
say() { echo "setup.sh: $*"; }
stage_start=$(date +%s) stages=""
stage_done() { stages="$stages${stages:+, }$1 $(( $(date +%s) - stage_start )) s"; stage_start=$(date +%s); }

if [ ! -x "$venv/bin/python" ]; then
  say "creating the virtual environment $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
stamp="$venv/.playbook-setup"
want="$(python -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest(), sys.version.split()[0])')"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  say "$venv is up to date with pyproject.toml: pip skipped (delete $stamp to force it)"
else
  rm -f "$stamp"
  if ! python -c "import torch" 2>/dev/null; then
    index="https://download.pytorch.org/whl/cpu" why="no GPU found" usual="pip's usual index"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then index="" why="a GPU was found"; fi
    if [ -n "${PLAYBOOK_TORCH_INDEX+set}" ]; then index="$PLAYBOOK_TORCH_INDEX" why="PLAYBOOK_TORCH_INDEX"; fi
    say "installing PyTorch (${PLAYBOOK_TORCH:-torch}) from ${index:-$usual} ($why; about a minute)"
    # pip retries an unreachable index for minutes, a line per retry: ask once, quietly, and say what follows
    if ! pip install --quiet --disable-pip-version-check --retries 0 --timeout 15 \
        ${index:+--index-url "$index"} "${PLAYBOOK_TORCH:-torch}" 2>"$venv/.torch-install.log"; then
      if [ -n "$index" ] && [ -z "${PLAYBOOK_TORCH_INDEX+set}" ]; then
        say "PyTorch's CPU index $index is unreachable: taking torch from pip's usual index instead (on Linux the CUDA build, several GB, which runs on CPU too; set PLAYBOOK_TORCH_INDEX to a mirror of the CPU index to avoid it)"
        if ! pip install --quiet --disable-pip-version-check "${PLAYBOOK_TORCH:-torch}" 2>"$venv/.torch-install.log"; then
          say "could not install PyTorch from pip's usual index either: see $venv/.torch-install.log" >&2
          exit 1
        fi
      else
        say "could not install PyTorch from ${index:-$usual} (pip's message: $venv/.torch-install.log). If that index is unreachable, set" >&2
        say "PLAYBOOK_TORCH_INDEX to a mirror of it, or to empty for pip's usual index (on Linux that is the CUDA build, several GB)" >&2
        exit 1
      fi
    fi
  fi
  say "installing the playbook and its dependencies (pip install -e '.[dev]')"
  pip install --quiet --disable-pip-version-check -e ".[dev]"
  echo "$want" > "$stamp"
fi
# Chapters stay without outputs in git however JupyterLab saves them: a clean filter strips outputs and
# execution counts from what git stores (the working copy keeps them). .gitattributes names the filter.
if git rev-parse --git-dir >/dev/null 2>&1; then
  git config filter.playbook-strip-outputs.clean "python3 playbook/book/strip.py"
  git config filter.playbook-strip-outputs.smudge cat
fi

if [ "$what" = lab ]; then
  root=()
  if [ "$(id -u)" = 0 ]; then
    root=(--allow-root)   # Jupyter refuses root without it; a container's only user is often root
    say "running as root: passing --allow-root to JupyterLab"
  fi
  say "starting JupyterLab on notebooks/ (the CLI: .venv/bin/playbook, or 'source .venv/bin/activate' then playbook)"
  exec python -m jupyter lab notebooks/ "${root[@]}" "$@"
fi
if [ "$what" = book ]; then
  say "building the static book: every chapter executed, then build/book/"
  exec python -m playbook.book --execute --out build/book   # prints where the index page is
fi
stage_done setup
say "lint (ruff check) and format (ruff format --check)"
ruff check .   # two lines: under set -e a failure on the left of && would not stop the script
ruff format --check --quiet playbook tests benchmarks
stage_done lint
browser="$(python -c 'import sys; sys.path.insert(0, "tests"); from browser.conftest import why_not_here; print(why_not_here() or "")')"
# In tests/, each chapter is executed once: by Run All in JupyterLab when a browser is here (tests/browser fails
# on any error output, a cell left unrun or a timeout, and checks every widget), which keeps the executed copy
# in build/executed/; tests/book/test_book.py then builds the book from those copies (else it executes the chapters).
# nbmake executes every chapter once more, as a course that adopts them does in its own CI.
if [ -z "$browser" ]; then
  say "tests: every chapter in JupyterLab under headless Chromium, then the book built from those runs; the other tests"
  chapters=(tests/browser tests/book/test_book.py)
elif [ "${CI:-}" = true ]; then
  say "CI=true, and the JupyterLab browser tests cannot run: $browser" >&2
  exit 1
else
  say "tests: tests/book/test_book.py executes every chapter; the other tests; browser tests skipped: $browser"
  chapters=(tests/book/test_book.py)
fi
# Three pytest runs side by side, each with its own ranks and kernels: on 2 cores each leaves a core idle
# much of the time (a browser that draws, a kernel that waits on its ranks, a test waiting on a subprocess),
# so together they take minutes less than one after the other. (1) the chapters and the book, above; (2)
# every other test in tests/; (3) what a course that adopts the chapters runs in its own CI: every chapter
# executed by nbmake, each cell within 120 s on a 2-core machine. ARGS go to all three (a -k that selects
# nothing in one of them is fine: exit 5). The outputs of (2) and (3) follow (1)'s; each ends with its
# slowest items (--durations). An interrupted run stops all three.
say "beside them: the other tests in tests/, and pytest --nbmake notebooks/ (every chapter executed as a course's CI would; each cell within 120 s)"
logs="$(mktemp -d)" started=$(date +%s)
# (trap - INT: bash starts a command put in the background with Ctrl-C ignored, and the tests of Ctrl-C need it)
(trap - INT; exec python -m pytest tests --ignore=tests/browser --ignore=tests/book/test_book.py --durations=15 "$@") >"$logs/tests" 2>&1 &
testspid=$!
(trap - INT; exec python -m pytest --nbmake --nbmake-timeout=120 --durations=0 notebooks/ "$@") >"$logs/nbmake" 2>&1 &
nbpid=$!
trap 'kill "$testspid" "$nbpid" 2>/dev/null || true; rm -rf "$logs"' EXIT   # (|| true: set -e holds in a trap too)
codes=()
python -m pytest "${chapters[@]}" --durations=15 "$@" && codes+=(0) || codes+=($?)
stage_done "chapters and book"
for part in tests nbmake; do
  pid=testspid what="the other tests in tests/" stage="other tests"
  [ "$part" = nbmake ] && pid=nbpid what="pytest --nbmake notebooks/" stage=nbmake
  wait "${!pid}" && codes+=(0) || codes+=($?)
  say "$what (started with the chapters, done after $(( $(date +%s) - started )) s):"
  cat "$logs/$part"
  stage_done "$stage after that"
done
status=0 selected=0
for code in "${codes[@]}"; do
  [ "$code" = 5 ] && continue   # this part selected no test
  selected=1
  [ "$status" = 0 ] && status=$code
done
[ "$selected" = 0 ] && status=5   # nothing selected anywhere: pytest's own "no tests ran"
say "stage times: $stages (load average now $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown))"
exit "$status"
