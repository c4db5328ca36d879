"""Chapter 5's exercise: merge attention blocks with their log-sum-exp (``playbook.exercises.cp``)."""

from _insert import insert, solution_markdown

from playbook.exercises import cp

BEFORE = "**Question"  # the chapter's closing section (None: at the end)
CELLS = [
    (
        "md",
        "## Exercise: merge two attention blocks\n\n"
        "A ring step gives, for each query, the output `o_i` [T, D] of attention over one block of keys "
        "(normalized within the block) and the log-sum-exp `lse_i` [T] of that block's scores. Write "
        "`merge(o1, lse1, o2, lse2)` returning the `(o, lse)` of attention over both blocks. The check gives "
        "each real rank one block of keys, all-gathers the blocks and folds them with your `merge`, and "
        "compares with attention over all keys on one process — once with ordinary scores, once with scores "
        "near 1e3.\n\n"
        "*Hint:* block i's share of the softmax mass is `exp(lse_i − lse)`. And `exp(1000)` in float32 is…?",
    ),
    (
        "code",
        "import torch  # noqa: F401  (for your code)\n"
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def merge(o1, lse1, o2, lse2):\n"
        '    """o_i [T, D], lse_i [T] -> (o [T, D], lse [T]) of attention over both blocks."""\n'
        '    raise NotYetWritten("merge")  # replace this line with your code',
    ),
    ("code", "exercises.cp.check(merge)"),
    ("md", solution_markdown((cp.solution, "merge"))),
]

if __name__ == "__main__":
    print(insert("05", CELLS, before=BEFORE))
