"""Chapter 8's exercise: the ranks of every group for a layout (``playbook.exercises.mesh``).

For the lead to apply after merging (the notebook was being edited elsewhere):
``python notebooks/_exercise_cells/08.py`` inserts the section before "## Questions".
"""

from _insert import insert, solution_markdown

from playbook.exercises import mesh

BEFORE = "## Questions"  # the chapter's closing section (None: at the end)
CELLS = [
    (
        "md",
        "## Exercise: the groups of a layout\n\n"
        "Ranks are numbered tp fastest, then cp, dp, pp: `rank = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i))`. "
        "Write `groups(dims, axis)` returning every group along `axis` (tp, cp, dp or pp) as lists of global "
        "ranks. The check compares with the groups the runtime mesh builds its process groups from, on "
        "several layouts.\n\n"
        "*Hint:* the ranks of one group differ only in that axis' coordinate; what is the distance between "
        "two neighbours along it?",
    ),
    (
        "code",
        "from playbook import exercises\n"
        "from playbook.dims import ParallelDims\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def groups(dims, axis):\n"
        '    """Every group along `axis` of `dims` (a ParallelDims), each a list of global ranks."""\n'
        '    raise NotYetWritten("groups")  # replace this line with your code',
    ),
    ("code", "exercises.mesh.check(groups)"),
    ("md", solution_markdown((mesh.solution, "groups"))),
]

if __name__ == "__main__":
    print(insert("08", CELLS, before=BEFORE))
