"""Which chapters one of several browser runs side by side takes (``PLAYBOOK_BROWSER_SHARD=k/n``):
``setup.sh test`` runs two JupyterLabs at once, each on half the chapters, so that the slowest part
of the suite, the chapters in a browser, ends sooner on a 2-core machine."""

from __future__ import annotations

import pytest

# Rough seconds per chapter (open, Run All, every control; 2 cores, the rest of the suite beside):
# they only balance the shards, so a stale figure costs minutes of balance, never a check.
SECONDS = {
    "04_pipeline_parallel": 140, "03_tensor_parallel": 100, "05_context_parallel": 80, "08_hybrid_mesh": 70,
    "06_expert_parallel": 65, "08b_planning": 62, "00_memory_budgets": 55, "02_fsdp_zero": 55,
    "09_debugging": 53, "07_serving": 50, "01_data_parallel": 42,
}  # fmt: skip


def shard(ids: list[str], spec: str | None) -> list[str]:
    """The chapters of shard ``k/n`` (None or empty: all), in their order: longest first, each to the
    shard with the fewest seconds so far, so that n runs side by side finish close together. Every
    chapter is in exactly one shard (``tests/docs/test_browser_shards.py``)."""
    if not spec:
        return ids
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"PLAYBOOK_BROWSER_SHARD={spec!r}: expected k/n with 1 <= k <= n, e.g. 1/2")
    loads, mine = [0.0] * n, set()
    for name in sorted(ids, key=lambda i: (-SECONDS.get(i, 60), i)):
        least = loads.index(min(loads))
        loads[least] += SECONDS.get(name, 60)
        if least == k - 1:
            mine.add(name)
    return [i for i in ids if i in mine]
