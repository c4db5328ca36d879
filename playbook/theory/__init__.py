"""Predict: pure functions of configs, layouts and hardware. Nothing here starts a process or imports torch.

Groups in layers; a group imports only from its own layer or below (``tests/docs/test_import_graph.py``):

    0  cost/       collectives, FLOPs, matmul speed        inventory/  a block's saved tensors, model state
    1  dp/  zero/  tp/  pp/  cp.py  moe/                    one strategy each
       topology/   a cluster's levels past the node, collectives on them, axes placed on them
       life/       checkpoints, failures and goodput at scale (chapter 10)
    2  hybrid/     any layout at once: the layout value (``Plan``), its refusals, bytes and memory per rank
       checkpoint/ a distributed checkpoint: each rank's pieces of every tensor, the bytes it writes
    3  plan/       the planner at scale                      serving/    inference

Each group's ``__init__`` maps its files and exports what the chapters use.
"""

from playbook.theory.hybrid.memory import inference_memory, training_memory

__all__ = ["inference_memory", "training_memory"]
