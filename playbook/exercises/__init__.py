"""Exercises checked on real ranks: one module per chapter, each with ``check(fn)``.

The learner writes the piece of a strategy that matters; ``check`` runs it the way the package runs
its own code (on real ranks, or through the schedule simulator) against the single-process
reference, and answers with a :class:`Verdict`: what is wrong in the learner's terms (which tensor on
which rank, by how much; which collective was called a different number of times or with other
bytes than predicted; a hang named within seconds), or, when right, the measured numbers.

- ``dp``: the bucket all-reduce with averaging; real ranks, against the whole-batch gradient.
- ``zero``: the ZeRO-1 step (reduce-scatter, update the shard, all-gather); real ranks, against one
  process's step.
- ``tp``: a column- then a row-parallel linear with f and g; real ranks, forward and backward.
- ``pp``: one rank's 1F1B list, as data; every rank's list played in the schedule simulator.
- ``cp``: the log-sum-exp merge of attention blocks; real ranks (a block of keys each), scores of 1e3.
- ``ep``: the dispatch permutation, the send counts and the inverse; real tokens, real all-to-alls.
- ``mesh``: the ranks of every group of a layout; against ``ParallelDims.groups`` (the runtime's).
- ``serving``: KV bytes per token and sequences that fit; ``theory.serving.serving`` and a real cache block.

``pp``, ``mesh`` and ``serving`` check pure functions in this process: ranks would add start-up
time and nothing else.

How the chapter notebooks run them (and why they pass under nbmake):
the exercise cell defines the learner's function with the blank body ``raise NotYetWritten(...)``;
the next cell calls ``check`` and prints its verdict, which for a blank says "not yet written — fill
in the cell above". Nothing raises, so a notebook runs top to bottom as shipped; the solution sits
folded in a markdown ``<details>`` cell (the module's own ``solution``, copied in by
``notebooks/_exercise_cells/NN.py``, which inserts a chapter's cells), and
``tests/exercises/test_exercises.py`` / ``test_exercises_offline.py`` check every solution and a set of
realistic wrong answers. Running the solutions in the notebooks instead was rejected: the chapter
would then show the answer before the learner tried.

    from playbook import exercises
    exercises.dp.check(average_buckets)
"""

from playbook.exercises import cp, dp, ep, mesh, pp, serving, tp, zero
from playbook.exercises._common import NotYetWritten, Verdict

__all__ = ["NotYetWritten", "Verdict", "cp", "dp", "ep", "mesh", "pp", "serving", "tp", "zero"]
