"""Tensor and sequence parallelism (chapter 3), Megatron-LM's split of every block.

- ``layers.py``: f/g, column- and row-parallel linears, the vocab-parallel embedding and loss.
- ``model.py``: the GPT with its blocks split over tp (+SP), and the algorithm's helpers.
- ``moe.py``: a mixture of experts under tp (router replicated, tokens split).
- ``run.py``: ``playbook run tp``; ``native.py``: the native counterpart, DTensor's ``parallelize_module``.
"""
