"""Chapter 4's exercise: one rank's 1F1B list (checked through the simulator, ``playbook.exercises.pp``)."""

from _insert import insert, solution_markdown

from playbook.exercises import pp

BEFORE = "**Question"  # the chapter's closing section (None: at the end)
CELLS = [
    (
        "md",
        "## Exercise: the 1F1B list of one rank\n\n"
        'Write `one_f_one_b(rank, p, m)`: the order in which `rank` runs the forwards `("F", i)` and '
        'backwards `("B", i)` of micro-batches 0..m−1 under 1F1B with p stages. The check builds every '
        "rank's list with your function, inserts the sends and receives and plays them in the simulator of "
        "this chapter (a deadlock is named), for several (p, m), and compares with 1F1B: the bubble and the "
        "micro-batches held per rank.\n\n"
        "*Hint:* three phases — a warm-up of forwards (how many on rank r before the first backward can "
        "come back?), a steady state of one forward then one backward, a cool-down of backwards. Mind m < p.",
    ),
    (
        "code",
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def one_f_one_b(rank, p, m):\n"
        '    """[("F", 0), ("F", 1), ("B", 0), ...]: the compute order of `rank` under 1F1B."""\n'
        '    raise NotYetWritten("one_f_one_b")  # replace this line with your code',
    ),
    ("code", "exercises.pp.check(one_f_one_b)"),
    ("md", solution_markdown((pp.solution, "one_f_one_b"))),
]

if __name__ == "__main__":
    print(insert("04", CELLS, before=BEFORE))
