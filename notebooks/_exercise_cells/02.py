"""Chapter 2's exercise: the ZeRO-1 optimizer step (checked by ``playbook.exercises.zero``)."""

from _insert import insert, solution_markdown

from playbook.exercises import zero

BEFORE = "**Question"  # the chapter's closing section (None: at the end)
CELLS = [
    (
        "md",
        "## Exercise: the ZeRO-1 step\n\n"
        "Every rank holds all P parameters `params` (flat) and its own gradients `grads`. Write "
        "`zero1_step(params, grads, update, group)`: reduce-scatter the gradients so that rank r gets the "
        "sum of its shard, elements `[r·P/n, (r+1)·P/n)`, average it, call `update(param_shard, grad_shard)` "
        "on rank r's shard of the parameters only (that is what shards the optimizer state), then all-gather "
        "the updated shards so that every rank holds all P again. The check runs it on real ranks, compares "
        "every parameter with one process's step and the bytes with 2·P·4·(n−1)/n.\n\n"
        "*Hint:* `dist.reduce_scatter_single(out, inp, group=group)` and "
        "`dist.all_gather_single(out, inp, group=group)` work on flat tensors; a slice of `params` is a view.",
    ),
    (
        "code",
        "import torch  # noqa: F401  (for your code)\n"
        "import torch.distributed as dist  # noqa: F401  (for your code)\n"
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def zero1_step(params, grads, update, group):\n"
        '    """params, grads: [P] on every rank. Reduce-scatter, update your shard, all-gather; in place."""\n'
        '    raise NotYetWritten("zero1_step")  # replace this line with your code',
    ),
    ("code", "exercises.zero.check(zero1_step)"),
    ("md", solution_markdown((zero.solution, "zero1_step"))),
]

if __name__ == "__main__":
    print(insert("02", CELLS, before=BEFORE))
