"""Serving our GPT on real ranks (chapter 7), each layout checked against one process's greedy tokens.

- The engine: ``kv.py`` (contiguous and paged KV caches), ``generate.py`` (greedy decoding with a
  cache, one process or TP shards), ``batching.py`` (continuous batching, chunked prefill),
  ``packed.py`` (one forward over a step's mixed tokens), ``prefix.py`` (prefix caching),
  ``speculative.py`` (speculative decode steps: draft, verify, roll back) with ``drafts.py``.
- Quantized: ``quant.py`` (INT8/FP8 weights, per-output-channel scales), ``kv_quant.py`` (an 8-bit
  paged KV cache with per-block scales), ``accuracy.py`` (logit error and top-1 agreement against
  fp32), ``quant_ref.py`` (the one-process reference of a quantized run, its bytes).
- On ranks: ``run.py`` (``playbook run serve``: TP replicas in DP), ``ranks.py`` (each rank's work),
  ``checks.py`` (refused before any rank starts), ``report.py`` (against the reference),
  ``pipeline.py`` and ``experts.py`` (PP and EP decoding), ``disagg.py`` (prefill and decode apart),
  ``moe_tp.py`` and ``moe_layouts.py`` (a MoE under TP attention against DP attention, ``--attention-dp``).
- Measured: ``rates.py`` (prefill and decode timed, the roofline's rates), ``latency.py`` (TTFT,
  TPOT, goodput), ``serve_bench.py`` (``playbook serve-bench``), ``prefix_bench.py``, ``spec_bench.py``
  (speculation's acceptance and speed-up per k beside the prediction).

Predictions live in ``playbook.theory.serving``.
"""
