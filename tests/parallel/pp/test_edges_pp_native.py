"""Issue 31, item 14: torch's pipeline stages are built with their shapes known from the config
(static mode), so no rank sends another a pickle: ``send_object_list``/``recv_object_list`` (and
every ``*_object`` collective) serialise through ``distributed_c10d._object_to_tensor`` and
``_tensor_to_object``, which each rank here counts while torch's schedule runs."""

from __future__ import annotations

import pytest
import torch.distributed.distributed_c10d as c10d

from playbook.parallel.parity import assert_parity, reference
from playbook.parallel.pp.run import PipelineSetup, merge
from playbook.parallel.pp.native import native_on_rank
from playbook.parallel.report import compare

TINY = PipelineSetup(model="gpt-tiny", steps=2, global_batch=8, seq_len=16)


def _native_counting_pickles(ctx, setup, **kwargs):
    calls = []
    saved = c10d._object_to_tensor, c10d._tensor_to_object

    def to_tensor(obj, *a, **kw):
        calls.append(type(obj).__name__)
        return saved[0](obj, *a, **kw)

    def to_object(*a, **kw):
        calls.append("received")
        return saved[1](*a, **kw)

    c10d._object_to_tensor, c10d._tensor_to_object = to_tensor, to_object
    try:
        result = native_on_rank(ctx, setup, **kwargs)
    finally:
        c10d._object_to_tensor, c10d._tensor_to_object = saved
    return result | {"pickled": calls}


@pytest.mark.parametrize("schedule,v,m", [("1f1b", 1, 4), ("zb-v", 2, 4)])
def test_torch_pipeline_stages_exchange_no_pickles_and_still_match(ranks2, schedule, v, m):
    results = ranks2.run(_native_counting_pickles, TINY, schedule=schedule, m=m, v=v, progress=False)
    assert [r["pickled"] for r in results] == [[], []], [r["pickled"] for r in results]
    assert_parity(compare(merge(results), reference(TINY)), TINY, schedule)


def test_a_global_batch_torch_cannot_cut_into_m_equal_micro_batches_is_one_line(ranks2):
    with pytest.raises(Exception, match="m=3 micro-batches do not split global_batch=8"):
        ranks2.run(native_on_rank, TINY, schedule="1f1b", m=3, progress=False)
