"""Run: the notebook's shared rank set (``ranks(n)``), the fresh launch (``launch(fn, n)``), and
running as one rank under ``torchrun``."""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from playbook.cluster.checks import _check_options, default_backend
from playbook.cluster.pool import Ranks
from playbook.cluster.rank import RankContext
from playbook.config import require_positive

_shared: dict[str, Ranks] = {}


_LIVE_OPTIONS = ("timeout", "error_grace")  # applied to running ranks as they are
_RESTART_OPTIONS = ("threads_per_rank", "start_method")  # fixed when a rank starts: changing one restarts


def ranks(world_size: int, *, backend: str = "auto", **options) -> Ranks:
    """The notebook's persistent ranks: started on first use, reused by every cell. Stopped when the
    kernel exits.

    Options you pass are applied: ``timeout`` and ``error_grace`` at once, ``threads_per_rank`` and
    ``start_method`` by restarting the set (it says so); options you leave out keep their current
    values. A change of ``world_size`` or ``backend`` restarts the set. Everything is checked before
    the running set is touched, so a refused call leaves it running."""
    known = _LIVE_OPTIONS + _RESTART_OPTIONS
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"ranks() got unknown option(s) {unknown}; known: {', '.join(known)}")
    current = _shared.get("ranks")
    kept = {k: getattr(current, k) for k in known} if current is not None else {}
    wanted = kept | options
    require_positive(world_size=world_size)
    chosen = default_backend(world_size) if backend == "auto" else backend
    fresh = Ranks(world_size, backend=chosen, **wanted)  # validates everything; starts nothing
    if current is not None and (current.world_size, current.backend) == (world_size, chosen):
        changed = [k for k in _RESTART_OPTIONS if getattr(current, k) != wanted[k]]
        if not changed:
            for k in _LIVE_OPTIONS:
                setattr(current, k, wanted[k])
            return current.start()
        what = ", ".join(f"{k} {getattr(current, k)!r} -> {wanted[k]!r}" for k in changed)
        print(f"playbook: restarting the {world_size} ranks: {what}", file=sys.stderr, flush=True)
    if current is not None:
        current.stop()
    _shared["ranks"] = fresh
    return fresh.start()


def running_ranks() -> Ranks | None:
    """The notebook's shared set of ranks (the last ``ranks()`` started), or None."""
    return _shared.get("ranks")


@atexit.register
def _stop_shared() -> None:
    for r in _shared.values():
        r.stop()


# What torchrun sets for every process it starts, and what init_process_group("env://") reads.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """This process was started by torchrun (or a launcher like it): its whole environment is here."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def torchrun_env_problem() -> str | None:
    """One line when the environment holds part of torchrun's variables but not all of them (a stray
    ``TORCHELASTIC_RUN_ID`` from an outer job, a ``RANK`` and ``WORLD_SIZE`` set by hand), or
    values that are not what torchrun writes; None when it is all there or none of it is."""
    env = os.environ
    if not under_torchrun():
        if "TORCHELASTIC_RUN_ID" not in env and not ("RANK" in env and "WORLD_SIZE" in env):
            return None
        have = [n for n in ("TORCHELASTIC_RUN_ID", *TORCHRUN_ENV) if n in env]
        missing = [n for n in TORCHRUN_ENV if n not in env]
        return (
            f"{', '.join(have)} {'is' if len(have) == 1 else 'are'} set but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: part of torchrun's environment; start it under torchrun "
            f"(torchrun --nproc-per-node 2 -m playbook.cli run ...) or unset {', '.join(have)} to start local ranks"
        )
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        if not env[name].isdigit():
            return (
                f"{name}={env[name]!r} is not a whole number; torchrun sets it (a launcher that imitates it must too)"
            )
    if int(env["RANK"]) >= int(env["WORLD_SIZE"]):
        return f"RANK={env['RANK']} is not below WORLD_SIZE={env['WORLD_SIZE']}; torchrun numbers ranks 0..WORLD_SIZE-1"
    return None


DEFAULT_TIMEOUT = 300.0  # seconds a fresh launch() waits for every result, unless told otherwise


def launch(
    fn: Callable,
    world_size: int | None = None,
    *args,
    backend: str = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    progress: bool = True,
    traces: list | None = None,
    **kwargs,
) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on fresh ranks and stop them; return every rank's result.
    ``timeout``: seconds to wait for every result; ``progress``: the progress bar; ``traces``: a list
    this launch's spans (every rank's) are appended to.

    Under ``torchrun`` this process *is* one rank: the group is joined from the environment,
    ``fn`` runs here, and every rank gets the list of all results (``world_size`` may be None).
    """
    if under_torchrun():
        return _run_as_torchrun_rank(fn, world_size, backend, *args, **kwargs)
    if world_size is None:
        raise ValueError("world_size is required outside torchrun")
    r = Ranks(world_size, backend=backend, timeout=timeout)
    r._restart = ""  # one run: nothing restarts afterwards
    with r:
        results = r.run(fn, *args, progress=progress, **kwargs)
    if traces is not None:
        traces.append(r.last_trace)
    return results


@dataclass
class Launcher:
    """How one command starts ranks, handed to a strategy's ``run`` as ``launch=`` (its state passed
    along, not kept in module globals): each call is :func:`launch` with this ``timeout`` and
    ``progress`` bar, and appends its spans to ``traces`` in order (``playbook run --trace`` writes
    the first, the strategy's own run)."""

    timeout: float = DEFAULT_TIMEOUT
    progress: bool = True
    traces: list[list[dict]] = field(default_factory=list)

    def __post_init__(self):
        _check_options(self.timeout, 0.0, 1, "fork")  # one line for a bad --timeout, before any rank

    def __call__(self, fn: Callable, world_size: int | None = None, *args, **kwargs) -> list:
        return launch(fn, world_size, *args, timeout=self.timeout, progress=self.progress, traces=self.traces, **kwargs)


def _init_group(backend: str) -> None:
    """Join the job's process group from torchrun's environment. After an elastic restart
    (``TORCHELASTIC_RESTART_COUNT`` > 0, ``torchrun --max-restarts``) the agent's store still holds the
    keys the failed attempt wrote (gloo's addresses of ranks that are gone: measured here, the new
    attempt timed out connecting to them); each attempt then gets keys of its own, under a prefix."""
    import datetime

    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    env = os.environ
    timeout = datetime.timedelta(minutes=10)
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), False, timeout=timeout)
    store = dist.PrefixStore(f"/playbook/attempt_{attempt}", store)
    dist.init_process_group(backend, store=store, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]))


def _run_as_torchrun_rank(fn, world_size, backend, *args, **kwargs) -> list:
    import torch
    import torch.distributed as dist

    from playbook.cluster.trace import tracer as trace

    problem = torchrun_env_problem()
    if problem:
        raise ValueError(problem)
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != env_world:
        raise ValueError(
            f"world_size={world_size} but torchrun started WORLD_SIZE={env_world}; pass --nproc-per-node/--nnodes to match"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > local_rank else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        _init_group(backend)
    trace.install()
    tracer = trace.Tracer(dist.get_rank())
    ctx = RankContext(dist.get_rank(), env_world, backend, device, dist.group.WORLD, tracer)
    with trace.recording(tracer):
        result = fn(ctx, *args, **kwargs)
    everyone = [None] * env_world
    dist.all_gather_object(everyone, result)
    return everyone
