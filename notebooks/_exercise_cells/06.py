"""Chapter 6's exercise: permutation and send counts for the all-to-all (``playbook.exercises.ep``).

For the lead to apply after merging (the notebook was being edited elsewhere):
``python notebooks/_exercise_cells/06.py`` inserts the section before "What to remember".
"""

from _insert import insert, solution_markdown

from playbook.exercises import ep

BEFORE = "## What to remember"  # the chapter's closing section
CELLS = [
    (
        "md",
        "## Exercise: dispatch tokens to their experts\n\n"
        "Expert e lives on rank `e // experts_per_rank`. `all_to_all_single` sends contiguous pieces, so a rank "
        "first permutes its tokens so that those for rank 0 come first, then rank 1's, …, and says how many "
        "go to each rank. Write `plan(expert_of_token, n_ranks, experts_per_rank)` returning `(order, "
        "send_counts)` and `restore(y_sorted, order)` putting the outputs, which come back in that sorted "
        "order, back in token order. The check moves real tokens through real all-to-alls with your plan, "
        "applies each expert, and compares with one process; the bytes with those your counts predict.\n\n"
        "*Hint:* `torch.argsort(..., stable=True)` and `torch.bincount(..., minlength=...)`; row i of "
        "`y_sorted` belongs to token `order[i]`.",
    ),
    (
        "code",
        "import torch  # noqa: F401  (for your code)\n"
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def plan(expert_of_token, n_ranks, experts_per_rank):\n"
        '    """expert_of_token [T] -> (order [T], send_counts [n_ranks])."""\n'
        '    raise NotYetWritten("plan")  # replace this line with your code\n\n\n'
        "def restore(y_sorted, order):\n"
        '    """y_sorted [T, D] in `order` -> y [T, D] in token order."""\n'
        '    raise NotYetWritten("restore")  # replace this line with your code',
    ),
    ("code", "exercises.ep.check(plan, restore)"),
    ("md", solution_markdown((ep.solution_plan, "plan"), (ep.solution_restore, "restore"))),
]

if __name__ == "__main__":
    print(insert("06", CELLS, before=BEFORE))
