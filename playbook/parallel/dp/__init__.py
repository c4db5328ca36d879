"""Data parallelism (chapter 1): every rank holds the whole model and averages gradients.

- ``ddp.py``: the algorithm — naive per-tensor all-reduce, bucketed all-reduce, PyTorch's DDP beside them.
- ``run.py``: ``playbook run dp`` on real ranks, the scaling run, and the report against one process.
"""
