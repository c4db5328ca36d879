"""Chapters stay without outputs in git however they are saved: git's clean filter (``playbook/book/strip.py``,
installed by ``./setup.sh``, named in ``.gitattributes``) stores a notebook saved with outputs without
them, and passes a clean one through byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def with_outputs(path: Path) -> str:
    nb = json.loads(path.read_text())
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = i + 1
        cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": ["a long output\n"]}]
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_clean_chapter_passes_through_byte_for_byte(chapter):
    sys.path.insert(0, str(ROOT / "playbook" / "book"))
    from strip import strip

    assert strip(chapter.read_text()) == chapter.read_text()
    assert strip(with_outputs(chapter)) == chapter.read_text()


def test_git_stores_a_chapter_saved_with_outputs_without_them(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "playbook" / "book").mkdir(parents=True)
    shutil.copy(ROOT / "playbook" / "book" / "strip.py", repo / "playbook" / "book" / "strip.py")
    shutil.copy(ROOT / ".gitattributes", repo / ".gitattributes")
    chapter = CHAPTERS[0]
    (repo / "notebooks" / chapter.name).write_text(with_outputs(chapter))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    # what ./setup.sh configures
    subprocess.run(
        [*git, "config", "filter.playbook-strip-outputs.clean", "python3 playbook/book/strip.py"], check=True
    )
    subprocess.run([*git, "add", "."], check=True)
    stored = subprocess.run([*git, "show", f":notebooks/{chapter.name}"], capture_output=True, text=True, check=True)
    assert stored.stdout == chapter.read_text()
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert "notebooks" in status  # staged, and the working copy keeps its outputs
    assert "a long output" in (repo / "notebooks" / chapter.name).read_text()


def test_setup_installs_the_filter_that_gitattributes_names():
    attrs = (ROOT / ".gitattributes").read_text()
    assert "notebooks/*.ipynb filter=playbook-strip-outputs" in attrs
    assert 'filter.playbook-strip-outputs.clean "python3 playbook/book/strip.py"' in (ROOT / "setup.sh").read_text()
