"""Launch text for a planned layout: a ``torchrun`` command, a Slurm ``sbatch`` script, and the small
``playbook run hybrid`` replay of the same shape on the teaching model (pure strings, no torch).

``torchrun`` starts one process per GPU on every node (``--nnodes``, ``--nproc-per-node``; c10d
rendezvous, PyTorch's "torchrun (Elastic Launch)" documentation); under Slurm one task per node runs
it, the first node's host name serving as rendezvous endpoint (``scontrol show hostnames``).
Our ``hybrid`` strategy has no recomputation flag: the command says so in a comment.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.planner import Layout

REPLAY_MODEL = {False: "gpt-tiny", True: "gpt-tiny-moe"}


def hybrid_flags(lay: Layout) -> str:
    flags = [f"--{a} {v}" for a, v in lay.degrees.items() if v > 1 or a == "dp"]
    if lay.zero:
        flags.append(f"--zero {lay.zero}")
    if lay.tp > 1:
        flags.append("--sequence-parallel")
    if lay.pp > 1:
        flags.append(f"--microbatches {lay.microbatches}")
    return " ".join(flags)


def torchrun_command(lay: Layout, *, model: str, seq_len: int, global_batch: int, gpus_per_node: int) -> str:
    world = lay.dp * lay.tp * lay.pp * lay.cp
    nodes = max(1, world // gpus_per_node)
    per_node = min(world, gpus_per_node)
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint $MASTER_ADDR:29500 -m playbook.cli run hybrid --model {model} "
        f"{hybrid_flags(lay)} --global-batch {global_batch} --seq-len {seq_len} --steps 3"
        + (f"  # recompute={lay.recompute}: not a flag of our hybrid" if lay.recompute != "none" else "")
    )


def sbatch_script(lay: Layout, *, model: str, seq_len: int, global_batch: int, gpus_per_node: int) -> str:
    world = lay.dp * lay.tp * lay.pp * lay.cp
    nodes = max(1, world // gpus_per_node)
    run = torchrun_command(lay, model=model, seq_len=seq_len, global_batch=global_batch, gpus_per_node=gpus_per_node)
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name=plan-{model}",
            f"#SBATCH --nodes={nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={min(world, gpus_per_node)}",
            "#SBATCH --exclusive",
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"srun {run}",
        ]
    )


def replay_command(lay: Layout, *, moe: bool = False) -> str:
    """The same axes at degree ≤ 2 on the teaching model (``gpt-tiny``: 2 layers, 2 KV heads), so
    it runs on a laptop: ``playbook run hybrid`` then reports parity and bytes per collective."""
    model = ModelConfig.preset(REPLAY_MODEL[moe])
    small = {a: min(v, 2) for a, v in lay.degrees.items()}
    if small["ep"] > small["dp"] * small["cp"]:
        small["ep"] = 1
    m = small["pp"] * 2 if small["pp"] > 1 else 1
    batch = small["dp"] * m * 2
    dims = ParallelDims(**small)
    dims.check(model, seq_len=32, global_batch=batch, microbatches=m if small["pp"] > 1 else None)
    replay = Layout(**small, zero=lay.zero, micro_batch=2, microbatches=m, recompute="none")
    return f"playbook run hybrid --model {model.name} {hybrid_flags(replay)} --global-batch {batch} --seq-len 32"
