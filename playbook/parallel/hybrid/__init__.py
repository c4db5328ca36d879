"""The hybrid mesh (chapter 8): every axis at once, composed in one fixed order.

- ``parallelize.py``: the layout (``Plan``) and ``parallelize``: pipeline split, TP (+SP), EP, CP,
  recomputation, DP/ZeRO, and the training run.
- ``pipeline.py`` (the one pipeline driver), ``zero.py`` (ZeRO over dp×cp), ``moe.py`` (every stage's
  aux loss, routing), ``tied.py`` (the embedding group), ``recompute.py`` (activation recomputation).
- ``run.py``: ``playbook run hybrid``; ``merge.py``: the one reassembly of whole tensors for parity;
  ``native.py``: FSDP2 + DTensor on the same mesh; ``replay.py``: a planner candidate shrunk and replayed.
"""
