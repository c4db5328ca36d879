"""Data parallelism (chapter 1): every rank holds the whole model and averages gradients.

- ``ddp.py``: the algorithm — naive per-tensor all-reduce, bucketed all-reduce, PyTorch's DDP beside them.
- ``train.py``: one rank's training loop under a variant; ``scaling.py``: the same step on more ranks, timed.
- ``run.py``: ``playbook run dp`` on real ranks, and the report against one process.
"""
