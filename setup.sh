#!/usr/bin/env bash
# Set up a virtual environment (once) and then either open the notebooks or run every test.
#
#   ./setup.sh lab [ARGS...]    JupyterLab on the chapters (the main job; ARGS go to jupyter lab)
#   ./setup.sh test [ARGS...]   lint, then every test, every chapter run once and the book checked in a browser
#   ./setup.sh book             run every chapter and build the static book in build/book/ (no kernel to read it)
#
# Without a GPU it installs PyTorch's CPU build first, so pip does not pull a multi-GB CUDA build.
# PLAYBOOK_TORCH (a pip requirement, default "torch") and PLAYBOOK_TORCH_INDEX (default: PyTorch's
# CPU wheel index when there is no GPU; empty for pip's usual index) choose another build.
set -euo pipefail
cd "$(dirname "$0")"
venv="${PLAYBOOK_VENV:-.venv}"
what="${1:-}"
case "$what" in lab|test|book) shift ;; *) echo "usage: ./setup.sh lab [jupyter args] | test [pytest args] | book" >&2; exit 2 ;; esac

[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
if ! python -c "import torch" 2>/dev/null; then
  index="https://download.pytorch.org/whl/cpu"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then index=""; fi
  index="${PLAYBOOK_TORCH_INDEX-$index}"
  pip install ${index:+--index-url "$index"} "${PLAYBOOK_TORCH:-torch}"
fi
pip install -e ".[dev]"

if [ "$what" = lab ]; then
  exec jupyter lab notebooks/ "$@"
fi
if [ "$what" = book ]; then
  exec python -m playbook.book --execute --out build/book   # prints where the index page is
fi
echo "setup.sh: lint (ruff check) and format (ruff format --check)"
ruff check . && ruff format --check --quiet playbook tests benchmarks
# tests/test_book.py runs every chapter once (one test per notebook) and builds and browses the book from those runs
exec python -m pytest tests "$@"
