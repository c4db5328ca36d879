"""Launch text for a planned layout: a ``torchrun`` command and a Slurm ``sbatch`` script (pure
strings, no torch). The small replay of the same shape on the teaching model is ``theory.plan.shrink``.

``torchrun`` starts one process per GPU on every node (``--nnodes``, ``--nproc-per-node``; c10d
rendezvous, PyTorch's "torchrun (Elastic Launch)" documentation); under Slurm one task per node runs
it, the first node's host name serving as rendezvous endpoint (``scontrol show hostnames``).
Our ``hybrid`` strategy has no recomputation flag: the command says so in a comment.
"""

from __future__ import annotations

from playbook.theory.plan.search import Layout


def hybrid_flags(lay: Layout) -> str:
    flags = [f"--{a} {v}" for a, v in lay.degrees.items() if v > 1 or a == "dp"]
    if lay.zero:
        flags.append(f"--zero {lay.zero}")
    if lay.tp > 1:
        flags.append("--sequence-parallel")
    if lay.pp > 1:
        flags.append(f"--microbatches {lay.microbatches}")
        flags += [f"--schedule {lay.schedule}"] if lay.schedule != "1f1b" else []
        flags += [f"--chunks {lay.v}"] if lay.schedule == "interleaved" else []  # the V shapes imply 2
    return " ".join(flags)


def torchrun_command(lay: Layout, *, model: str, seq_len: int, global_batch: int, gpus_per_node: int) -> str:
    world = lay.dp * lay.tp * lay.pp * lay.cp
    nodes = max(1, world // gpus_per_node)
    per_node = min(world, gpus_per_node)
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint $MASTER_ADDR:29500 -m playbook.cli run hybrid --model {model} "
        f"{hybrid_flags(lay)} --global-batch {global_batch} --seq-len {seq_len} --steps 3" + _not_flags(lay)
    )


def _not_flags(lay: Layout) -> str:
    """A comment naming what the plan chose that ``run hybrid`` has no flag for (recomputation)."""
    missing = [f"recompute={lay.recompute}"] if lay.recompute != "none" else []
    return f"  # {', '.join(missing)}: not a flag of our hybrid" if missing else ""


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
