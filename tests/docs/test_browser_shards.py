"""The browser's shards (``tests/browser/shards.py``): setup.sh runs two side by side, and together
they must run every chapter exactly once, or a chapter would go unchecked (or run twice)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from browser.shards import SECONDS, shard  # noqa: E402

CHAPTERS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_shards_cover_every_chapter_once(n):
    taken = [c for k in range(1, n + 1) for c in shard(CHAPTERS, f"{k}/{n}")]
    assert sorted(taken) == CHAPTERS


def test_two_shards_are_within_a_chapter_of_each_other():
    a, b = (sum(SECONDS.get(c, 60) for c in shard(CHAPTERS, f"{k}/2")) for k in (1, 2))
    assert abs(a - b) <= max(SECONDS.values())


def test_no_shard_spec_takes_them_all_and_a_bad_one_is_one_line():
    assert shard(CHAPTERS, None) == CHAPTERS == shard(CHAPTERS, "")
    for bad in ("3/2", "0/2", "half", "1/0"):
        with pytest.raises(pytest.UsageError, match="expected k/n"):
            shard(CHAPTERS, bad)


def test_every_chapter_has_a_weight():
    """A new chapter without one still runs (weight 60 s) but may unbalance the shards: name it."""
    assert set(CHAPTERS) <= set(SECONDS), set(CHAPTERS) - set(SECONDS)
