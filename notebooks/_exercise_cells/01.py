"""Chapter 1's exercise: average the gradient buckets (checked by ``playbook.exercises.dp``)."""

from _insert import insert, solution_markdown

from playbook.exercises import dp

BEFORE = "**Question"  # the chapter's closing section (None: at the end)
CELLS = [
    (
        "md",
        "## Exercise: average the gradient buckets\n\n"
        "Each rank has run backward on its own slice of the batch and packed its gradients into flat buckets, "
        "as DDP does. Write `average_buckets(buckets, group)`: start one asynchronous all-reduce per bucket "
        "(what DDP's hook does the moment a bucket is full), then wait for each and turn the sum into the mean, "
        "in place. The check runs your function on this chapter's real ranks, compares every bucket on every "
        "rank with the gradient of the whole batch on one process, and counts your all-reduces against the "
        "bucket plan; a hang is named within seconds.\n\n"
        "*Hint:* `dist.all_reduce(t, group=group, async_op=True)` returns a handle with `.wait()`; "
        "an all-reduce **sums**.",
    ),
    (
        "code",
        "import torch.distributed as dist  # noqa: F401  (for your code)\n"
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def average_buckets(buckets, group):\n"
        '    """buckets: this rank\'s flat gradient tensors. Average each over `group`, in place."""\n'
        '    raise NotYetWritten("average_buckets")  # replace this line with your code',
    ),
    ("code", "exercises.dp.check(average_buckets)"),
    ("md", solution_markdown((dp.solution, "average_buckets"))),
]

if __name__ == "__main__":
    print(insert("01", CELLS, before=BEFORE))
