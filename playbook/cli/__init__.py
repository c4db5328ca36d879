"""``playbook`` on the command line: ``main.py`` (the parser, ``info``, ``memory``), ``run.py``
(``run STRATEGY`` on real ranks), ``plan.py`` + ``plan_layout.py`` (``plan``, ``serve-plan``; its MoE layouts: ``serve_plan_moe.py``),
``calibrate.py``, ``serve_bench.py``, ``checks.py`` (every number checked before a rank starts),
``trace.py`` (``--trace``: the Chrome trace file)."""

from playbook.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
