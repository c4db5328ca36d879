"""Run: real ``torch.distributed`` ranks that a notebook can use like a function call.

``Ranks(n)`` starts n processes once, each joins one process group and then waits for work;
``ranks.run(fn, ...)`` ships ``fn`` (by value, with cloudpickle, so a function defined in a notebook
cell works) to every rank, calls ``fn(ctx, ...)`` there and returns the n results in rank order.
``launch(fn, n)`` is the fresh-process form (start, run once, stop) for the CLI and tests; under
``torchrun`` it runs ``fn`` in the current process as this rank, so rank functions run unchanged
across nodes.

Failure is part of the lesson, so it is made visible and cheap:
- a rank that raises: :class:`RankError` with that rank's number and traceback; ranks left waiting
  for it in a collective are killed and restarted on the next call (a fraction of a second);
- a rank that dies (exits, is killed): :class:`RankError` naming it, its exit code or signal and
  the collective it was in, not the survivors that then lost their connection to it;
- a hang: :class:`RankTimeout` saying which collective each rank was waiting in, and for how long;
- Ctrl-C during a call, a kernel restart, or a dead parent (even one not yet reaped): every rank
  goes with it (a watchdog thread in each rank reads a pipe only the parent holds open, and watches
  the parent's state in /proc; ``PR_SET_PDEATHSIG`` on Linux as a third line). An interrupt that
  reaches idle ranks (Jupyter signals the whole process group) is ignored by them.

The rendezvous store listens on 127.0.0.1 only, and so do local gloo ranks (``GLOO_SOCKET_IFNAME``
is the loopback interface; under torchrun it is left to the user).

Processes come from a ``forkserver`` that has torch and playbook imported once (measured:
~0.15 s per fresh start instead of 6-7 s with spawn), with one compute thread per rank so that
n ranks on 2 cores do not thrash. The launcher choice is measured in ``benchmarks/bench_ranks.py``.

The package, one job per module: ``checks`` (backend, world size, options: refused before any rank
starts), ``rank`` (inside a rank: its loop, its context, its watchdog), ``processes`` (the forkserver,
the loopback store), ``pool`` (:class:`Ranks`), ``collect`` (one call's replies and the error that
names the cause), ``errors`` (:class:`RankError`, :class:`RankTimeout`), ``launch`` (``ranks()``,
``launch()``, the ``Launcher`` a command hands its strategy, torchrun); and what every rank stands on: ``mesh`` (a process group per mesh axis, built
once per layout), ``trace/`` (the tracer of every collective, its sizes, spans and Chrome trace file).
The cluster imports only the configure layer (``config``, ``dims``) and torch.
"""

from playbook.cluster.checks import check_world_size, default_backend, max_local_ranks
from playbook.cluster.errors import RankError, RankTimeout
from playbook.cluster.launch import (
    Launcher,
    launch,
    ranks,
    running_ranks,
    torchrun_env_problem,
    under_torchrun,
)
from playbook.cluster.pool import Ranks
from playbook.cluster.processes import PRELOAD
from playbook.cluster.rank import RankContext

__all__ = [
    "PRELOAD",
    "RankContext",
    "RankError",
    "RankTimeout",
    "Launcher",
    "Ranks",
    "check_world_size",
    "default_backend",
    "launch",
    "max_local_ranks",
    "ranks",
    "running_ranks",
    "torchrun_env_problem",
    "under_torchrun",
]
