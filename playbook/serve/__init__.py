"""Serving our GPT: KV caches (contiguous and paged), greedy generation in one process or over
tensor-parallel ranks, and a continuous-batching scheduler. Predictions: ``playbook.theory.serving``."""
