"""Run: :class:`Ranks`, a persistent set of real ranks: start once, ``run`` many times."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import sys
import time
import weakref
from typing import Callable

import cloudpickle

from playbook.cluster.checks import _check_options, check_world_size, default_backend
from playbook.cluster.collect import _Replies
from playbook.cluster.errors import RankError, _how_it_ended, _with_source
from playbook.cluster.processes import _forkserver_context, _kill, _loopback_store, _main_module_hidden
from playbook.cluster.rank import _STOP, STATUS_WIDTH, _rank_main
from playbook.config import require_positive


class Ranks(_Replies):
    """A persistent set of ``world_size`` real ranks. Start once, ``run`` many times.

    >>> ranks = Ranks(4)
    >>> ranks.run(lambda ctx: ctx.rank * 10)
    [0, 10, 20, 30]

    ``backend="auto"`` picks NCCL with one GPU per rank when there are enough GPUs, else gloo.
    ``timeout`` (seconds) bounds each call; ``error_grace`` is how long the other ranks get to
    finish after one rank raised before they are treated as stuck. ``start_method="spawn"`` is the
    slow fallback that always works (fresh interpreters, 6-7 s per start on 2 cores).
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "auto",
        timeout: float = 120.0,
        error_grace: float = 2.0,
        threads_per_rank: int = 1,
        start_method: str = "forkserver",
    ):
        require_positive(world_size=world_size)
        _check_options(timeout, error_grace, threads_per_rank, start_method)
        self.backend = default_backend(world_size) if backend == "auto" else backend
        check_world_size(world_size, self.backend)
        self.world_size, self.timeout, self.error_grace = world_size, timeout, error_grace
        self.threads_per_rank, self.start_method = threads_per_rank, start_method
        self.stall_after = 60.0  # seconds without a status change before a rank is said to make no progress
        self.processes: list = []
        self.last_trace: list[dict] = []  # spans of every rank from the last call, as dicts
        self.start_seconds: float | None = None
        self._conns: list = []
        self._lifelines: list = []  # writing ends: a rank exits when its end closes (we died)
        self._store = None
        self._restart = " and will restart on the next call"  # launch() runs once: it says nothing of restarts
        self._expect_running = False  # started and not stopped by us: if dead now, say so before restarting
        self._finalizer = weakref.finalize(self, _kill, self.processes)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self.processes) and all(p.is_alive() for p in self.processes)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def start(self) -> Ranks:
        """Start the ranks and wait until each has joined the process group."""
        if self.alive:
            return self
        if self._expect_running and self.processes:
            gone = [(r, p.exitcode) for r, p in enumerate(self.processes) if not p.is_alive()]
            what = "; ".join(f"rank {r} {_how_it_ended(code)}" for r, code in gone)
            print(
                f"playbook: the {self.world_size} ranks had stopped while idle ({what}); starting them again",
                file=sys.stderr,
                flush=True,
            )
        self.stop()
        t0 = time.perf_counter()
        ctx = _forkserver_context() if self.start_method == "forkserver" else mp.get_context(self.start_method)
        # The parent hosts the rendezvous store, on loopback only, on a port the OS picks.
        self._store = _loopback_store(self.world_size)
        self._status = ctx.Array(ctypes.c_char, STATUS_WIDTH * self.world_size, lock=False)
        self._since = ctx.Array(ctypes.c_double, self.world_size, lock=False)
        for rank in range(self.world_size):
            parent_conn, child_conn = ctx.Pipe()
            life_read, life_write = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_rank_main,
                args=(
                    rank,
                    self.world_size,
                    self.backend,
                    self._store.port,
                    self.threads_per_rank,
                    child_conn,
                    self._status,
                    self._since,
                    life_read,
                    os.getpid(),
                ),
                daemon=True,
                name=f"playbook-rank-{rank}",
            )
            with _main_module_hidden():
                p.start()
            child_conn.close()
            life_read.close()
            self.processes.append(p)
            self._conns.append(parent_conn)
            self._lifelines.append(life_write)
        try:
            self._collect("ready", timeout=max(60.0, min(self.timeout, 600.0)))
        except BaseException:
            self.stop(grace=0.0)
            raise
        self._expect_running = True
        self.start_seconds = time.perf_counter() - t0
        return self

    def stop(self, grace: float = 2.0) -> None:
        """Ask every rank to leave, kill whatever is left after ``grace`` seconds. Safe to call twice."""
        for conn in self._conns:
            try:
                conn.send_bytes(_STOP)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + grace
        for p in self.processes:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        _kill(self.processes)
        for conn in self._conns + self._lifelines:
            conn.close()
        self.processes.clear()
        self._conns.clear()
        self._lifelines.clear()
        self._store = None
        self._expect_running = False

    def __enter__(self) -> Ranks:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"Ranks(world_size={self.world_size}, backend={self.backend!r}, {state})"

    # -- running ----------------------------------------------------------------------------------
    def run(self, fn: Callable, *args, timeout: float | None = None, progress: bool = True, **kwargs) -> list:
        """Call ``fn(ctx, *args, **kwargs)`` on every rank; return the results in rank order."""
        if timeout is not None:
            _check_options(timeout, self.error_grace, self.threads_per_rank, self.start_method)
        self.start()
        payload = cloudpickle.dumps((fn, args, kwargs))
        for conn in self._conns:
            try:
                conn.send_bytes(payload)
            except OSError:  # that rank just died: _collect finds out from its exit status and names it
                pass
        try:
            results = self._collect("result", timeout=self.timeout if timeout is None else timeout, progress=progress)
        except RankError as e:
            self.stop(grace=0.0)  # ranks left waiting for the failed one are not reused: restart next call
            raise RankError(e.rank, _with_source(e.remote_traceback, fn), e.note, e.headline, e.exitcode) from None
        except BaseException:
            self.stop(grace=0.0)  # stuck or interrupted ranks are not reused; the next call restarts them
            raise
        return results

    def write_trace(self, path, *, title: str = "playbook ranks"):
        """Write the last call's spans of every rank (``last_trace``) as a Chrome trace, to open in
        Perfetto (https://ui.perfetto.dev) or ``chrome://tracing``: one row per rank, compute and
        communication threads, a flow arrow from each send to its receive. Returns the path."""
        from playbook.cluster.trace.chrome import write_chrome_trace

        return write_chrome_trace(path, self.last_trace, title=title)
