"""Pipeline parallelism (chapter 4): the model cut into stages, micro-batches passed along.

- ``executor.py``: plays one rank's list of a schedule on its chunks of the GPT; ``weights.py``: W apart from B.
- ``run.py``: ``playbook run pp`` on real ranks; ``native.py``: ``torch.distributed.pipelining`` on the same chunks.
- ``costs.py``: each piece of the GPT timed alone, to balance stages.
"""

from playbook.parallel.pp.run import PipelineSetup, merge, on_rank
from playbook.parallel.pp.native import native_on_rank, native_orders, native_pairs
from playbook.parallel.pp.costs import piece_costs

__all__ = ["PipelineSetup", "merge", "native_on_rank", "native_orders", "native_pairs", "on_rank", "piece_costs"]
