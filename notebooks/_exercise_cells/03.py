"""Chapter 3's exercise: column- and row-parallel linear with f and g (``playbook.exercises.tp``)."""

from _insert import insert, solution_markdown

from playbook.exercises import tp

BEFORE = "**Question"  # the chapter's closing section (None: at the end)
CELLS = [
    (
        "md",
        "## Exercise: Megatron's MLP with f and g\n\n"
        "Write `tp_mlp(x, w1, w2, group)` computing `gelu(x @ w1) @ w2` on t ranks: `w1` [H, F] split by "
        "columns (column-parallel), `w2` [F, H] split by rows (row-parallel), with Megatron's `f` (identity "
        "forward, all-reduce backward) and `g` (all-reduce forward, identity backward) where they belong. "
        "`w1` and `w2` arrive whole on every rank: slice your shard. The check runs forward and backward on "
        "real ranks and compares `y`, `x.grad` and each rank's weight-gradient shard with one process, and "
        "counts one all-reduce each way.\n\n"
        "*Hint:* each rank's `h @ w2_shard` is a partial sum of `y`. Which operator turns partial sums into "
        "the sum, and which one makes `x.grad` whole?",
    ),
    (
        "code",
        "import torch  # noqa: F401  (for your code)\n"
        "import torch.distributed as dist  # noqa: F401  (for your code)\n"
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n"
        "# f(x, group, label) and g(x, group, label): Megatron's pair, imported at the top of this chapter\n\n\n"
        "def tp_mlp(x, w1, w2, group):\n"
        '    """x [B, H]; w1 [H, F], w2 [F, H], whole. Return y [B, H] = gelu(x @ w1) @ w2, tensor-parallel."""\n'
        '    raise NotYetWritten("tp_mlp")  # replace this line with your code',
    ),
    ("code", "exercises.tp.check(tp_mlp)"),
    ("md", solution_markdown((tp.solution, "tp_mlp"))),
]

if __name__ == "__main__":
    print(insert("03", CELLS, before=BEFORE))
