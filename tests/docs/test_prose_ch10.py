"""The numbers chapter 10 (a run's life) states in prose, recomputed from the package; the numbers it
measures are printed by its cells and held by tests/parallel/test_loader.py and
tests/parallel/hybrid/test_hybrid_conditions.py."""

import json
import math
from pathlib import Path

import pytest

from playbook import Hardware, ModelConfig
from playbook.theory.life import (
    LLAMA3_FAILURES_PER_GPU_HOUR,
    checkpoint_bytes,
    checkpoint_bytes_per_param,
    cluster_mtbf,
    goodput,
    save_seconds,
    young_interval,
)

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "10_run_life.ipynb"
CELLS = {c["id"]: "".join(c["source"]) for c in json.loads(CHAPTER.read_text())["cells"]}
H100, LLAMA405 = Hardware.preset("h100-sxm"), ModelConfig.preset("llama-3.1-405b")


def _save() -> float:
    total = checkpoint_bytes(LLAMA405.num_params(), n_tensors=LLAMA405.num_param_tensors())["total"]
    return save_seconds(total, nodes=16_384 // 8, storage_bandwidth=H100.storage_bandwidth)


def test_llama3s_failures_as_the_chapter_states_them():
    """ "419 unexpected interruptions in 54 days of pre-training on 16,384 GPUs" and "about 2 × 10⁻⁵
    per GPU-hour"."""
    assert "419 unexpected interruptions in 54 days" in CELLS["life-00"] and "16,384 GPUs" in CELLS["life-00"]
    assert "about 2 × 10⁻⁵ per GPU-hour" in CELLS["life-10"]
    assert round(LLAMA3_FAILURES_PER_GPU_HOUR, 5) == 2e-5


def test_the_checkpoint_and_its_save():
    """ "14 bytes a parameter", "2 TB/s over its 2,048 nodes", "A 3-second save", "every few minutes"."""
    assert "14 bytes a parameter" in CELLS["life-10"] and checkpoint_bytes_per_param("mixed") == 14
    assert "2 TB/s over its 2,048 nodes" in CELLS["life-10"]
    assert H100.storage_bandwidth * 2048 == pytest.approx(2e12)
    assert "A 3-second save" in CELLS["life-12"] and round(_save()) == 3
    minutes = young_interval(_save(), cluster_mtbf(16_384)) / 60
    assert "every few minutes is best" in CELLS["life-12"] and 2 < minutes < 10


def test_a_slower_store_stretches_youngs_interval_by_root_ten():
    """ "at a tenth of the bandwidth Young's interval grows by √10"; and most of what is lost is the restart."""
    assert "grows by √10" in CELLS["life-12"]
    mtbf = cluster_mtbf(16_384)
    assert young_interval(10 * _save(), mtbf) / young_interval(_save(), mtbf) == pytest.approx(math.sqrt(10))
    tau = young_interval(_save(), mtbf)
    lost = 1 - goodput(tau, _save(), mtbf, 300.0)
    assert 1 - goodput(tau, _save(), mtbf, 0.0) < lost / 2  # "most of what is left is the restart"


def test_the_made_conditions_are_the_ones_the_prose_names():
    """ "a 200 ms loader", "rank 3 of a dp2 × tp2 layout sleeps 100 ms", the simulated example's "a
    failure every ~5 checkpoints" at Young's 20 s."""
    assert "200 ms loader" in CELLS["life-02"] and "DELAY = 0.2" in CELLS["life-03"]
    assert "sleeps 100 ms" in CELLS["life-06"] and "SLOW = 0.1" in CELLS["life-07"]
    assert "slow_rank=3" in CELLS["life-07"] and "dp=2, tp=2" in CELLS["life-07"]
    assert "at Young's 20 s, a failure every ~5 checkpoints" in CELLS["life-09"]
    assert young_interval(2.0, 100.0) == 20.0 and round(100.0 / (20.0 + 2.0)) == 5  # MTBF / (interval + save)
