"""Context parallelism (chapter 5): every sequence split across ranks.

- ``ring_attention.py``: ring (zig-zag causal balance), all-gather and Ulysses attention over a split sequence.
- ``model.py``: the whole model under CP and ``playbook run cp``.
"""
