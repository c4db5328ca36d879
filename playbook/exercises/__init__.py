"""Exercises checked on real ranks: one module per chapter, each with ``check(fn)``.

The learner writes the piece of a strategy that matters; ``check`` runs it the way the package runs
its own code (on real ranks, or through the schedule simulator) against the single-process
reference, and answers with a :class:`Verdict`: what is wrong in the learner's terms (which tensor on
which rank, by how much; which collective was called a different number of times or with other
bytes than predicted; a hang named within seconds), or, when right, the measured numbers.

How the chapter notebooks run them (and why they pass under nbmake):
the exercise cell defines the learner's function with the blank body ``raise NotYetWritten(...)``;
the next cell calls ``check`` and prints its verdict, which for a blank says "not yet written — fill
in the cell above". Nothing raises, so a notebook runs top to bottom as shipped; the solution sits
folded in a markdown ``<details>`` cell, and ``tests/test_exercises.py`` checks every solution
(``module.solution``) and a set of realistic wrong answers.

    from playbook import exercises
    exercises.dp.check(average_buckets)
"""

from playbook.exercises import cp, dp, ep, mesh, pp, serving, tp, zero
from playbook.exercises._common import NotYetWritten, Verdict

__all__ = ["NotYetWritten", "Verdict", "cp", "dp", "ep", "mesh", "pp", "serving", "tp", "zero"]
