"""Pipeline parallelism (chapter 4): the model cut into stages, micro-batches passed along.

- ``executor.py``: plays one rank's list of a schedule on its chunks of the GPT.
- ``pipeline.py``: ``playbook run pp`` on real ranks; ``native.py``: ``torch.distributed.pipelining`` on the same chunks.
"""
