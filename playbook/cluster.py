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
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import linecache
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import cloudpickle

from playbook.config import require_positive

_STOP = b"stop"  # the message that ends a rank's loop (a job is always a cloudpickle payload)
STATUS_WIDTH = 160  # bytes of status text per rank, in shared memory
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.pipelining",
    "playbook.cluster",
    "playbook.measure.trace",
]


class RankError(RuntimeError):
    """A rank raised. ``.rank`` is its number, ``.remote_traceback`` its traceback text."""

    def __init__(
        self, rank: int, remote_traceback: str, note: str = "", headline: str | None = None, exitcode: int | None = None
    ):
        self.rank, self.remote_traceback, self.note = rank, remote_traceback, note
        self.headline, self.exitcode = headline, exitcode
        last = remote_traceback.strip().splitlines()[-1] if remote_traceback.strip() else "died"
        body = f"\n\n--- traceback from rank {rank} ---\n{remote_traceback}" if exitcode is None else "\n"
        super().__init__(f"{headline or f'rank {rank} failed: {last}'}{body}{note}")


class RankTimeout(TimeoutError):
    """No result within the timeout. ``.waiting`` maps rank -> what it was doing."""

    def __init__(self, timeout: float, waiting: dict[int, str], restart: str = " and will restart on the next call"):
        self.waiting = waiting
        lines = "\n".join(f"  rank {r}: {what}" for r, what in sorted(waiting.items()))
        super().__init__(
            f"no result from all ranks within {timeout:g} s; the ranks were killed{restart}.\n"
            f"{lines}\n"
            "A rank waiting in a collective that another rank never entered is the usual cause: "
            "check that every rank calls the same collectives in the same order with the same shapes."
        )


def _with_source(remote_traceback: str, fn: Callable) -> str:
    """Put back the file name and source lines of frames that cloudpickle shipped by value (it
    names them ``<dynamic-code>``): the parent still has the notebook cell or file in linecache."""
    filename = getattr(getattr(fn, "__code__", None), "co_filename", None)
    if not filename:
        return remote_traceback

    def fill(match: re.Match) -> str:
        line = linecache.getline(filename, int(match[1])).strip()
        return f'File "{filename}", line {match[1]}, in {match[2]}\n' + (f"    {line}\n" if line else "")

    return re.sub(r'File "<dynamic-code>", line (\d+), in (\S+)\n', fill, remote_traceback)


def default_backend(world_size: int) -> str:
    """``nccl`` with one GPU per rank when there are enough GPUs, else ``gloo``."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def max_local_ranks() -> int:
    """How many ranks this machine runs well: 4 per CPU core, at least 16, so that a four-axis layout
    (dp2×tp2×pp2×cp2) runs on a laptop (on CPU, each rank is a process)."""
    return max(16, 4 * (os.cpu_count() or 1))


def check_world_size(world_size: int, backend: str) -> None:
    require_positive(world_size=world_size)
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ValueError(
                "backend='nccl' needs one GPU per rank and no GPU is visible; use backend='gloo' (CPU processes)"
            )
        if world_size > gpus:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) visible; "
                f"use backend='gloo', or world_size <= {gpus}, or torchrun across nodes"
            )
    elif backend != "gloo":
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    limit = max_local_ranks()
    if world_size > limit:
        good = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= limit]
        raise ValueError(
            f"world_size={world_size} is more ranks than this machine can run ({os.cpu_count()} CPU cores, "
            f"limit {limit}); try world_size in {{{', '.join(map(str, good))}}}, or torchrun across nodes"
        )


@dataclass
class RankContext:
    """What a rank function receives as its first argument: who it is and how to talk to the others.

    ``group`` is the world process group; pass it (or a subgroup) to collectives explicitly.
    ``mesh`` is the default 1-D layout (all ranks data-parallel); ``mesh_for(ParallelDims(...))``
    gives any other, with a process group per axis. ``tracer`` records every collective this call issues and compute spans you mark with
    ``with ctx.tracer.span("forward"):``. ``progress(done, total)`` feeds the notebook's progress bar.
    """

    rank: int
    world_size: int
    backend: str
    device: Any
    group: Any
    tracer: Any
    _send: Callable | None = field(default=None, repr=False)
    _last_progress: float = field(default=0.0, repr=False)

    @property
    def mesh(self):
        """The default mesh: every rank along one data-parallel axis (the world group)."""
        from playbook.parallel.mesh import world_mesh

        return world_mesh()

    def mesh_for(self, dims):
        """This rank's :class:`~playbook.parallel.mesh.Mesh` for a ``ParallelDims`` (built once per rank set)."""
        from playbook.parallel.mesh import build_mesh

        return build_mesh(dims)

    def progress(self, done: int, total: int, desc: str = "") -> None:
        now = time.monotonic()
        if self._send is not None and (done >= total or now - self._last_progress > 0.1):
            self._last_progress = now
            self._send(("progress", self.rank, done, total, desc))


# ----------------------------------------------------------------------------------------------
# inside a rank
# ----------------------------------------------------------------------------------------------


class _PrefixedStream:
    """Line-buffered stream that sends ``[rank r] text`` lines to the parent, which prints them."""

    def __init__(self, rank: int, send, name: str):
        self.rank, self.send, self.name, self.buffer = rank, send, name, ""

    def write(self, text: str) -> int:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            self.send(("print", self.name, f"[rank {self.rank}] {line}\n"))
        return len(text)

    def flush(self) -> None:
        if self.buffer:
            self.send(("print", self.name, f"[rank {self.rank}] {self.buffer}"))
            self.buffer = ""


def _process_state(pid: int) -> tuple[str, str] | None:
    """(state letter, start time) of ``pid`` from /proc, None if there is no such process;
    ("?", "") where /proc is missing (then only ``kill(pid, 0)`` can tell)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]  # fields 3 (state) and 22 (start time, in clock ticks since boot)
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
            return ("?", "")
        except ProcessLookupError:
            return None


def _die_with_parent(lifeline, parent_pid: int) -> None:
    """End this rank when the parent (the notebook kernel or script) dies, even while it is a zombie
    nobody has reaped yet (``kill(pid, 0)`` succeeds on a zombie, so polling the pid cannot see it).

    Two signs, either one enough: ``lifeline`` is the reading end of a pipe whose writing end only the
    parent holds, so the kernel closes it when the parent exits, reaped or not, and the pipe reads
    EOF; and the parent's state in /proc turns to Z (zombie) or X, or its pid vanishes or is reused
    (start time changed). The /proc check also covers a parent that had forked a helper which still
    holds the pipe. ``PR_SET_PDEATHSIG`` stays as a third line: it fires when the forkserver, our
    actual parent process, dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: parent = forkserver
        except OSError:
            pass
    born = _process_state(parent_pid)

    def parent_gone() -> bool:
        now = _process_state(parent_pid)
        return born is None or now is None or now[0] in "ZX" or now[1] != born[1]

    def watch():
        while True:
            try:
                if lifeline.poll(0.5):  # readable means EOF: the parent never writes to it
                    lifeline.recv_bytes()
            except (EOFError, OSError):
                os._exit(1)
            if parent_gone():
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="playbook-watchdog").start()


def _loopback_interface() -> str:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS and the BSDs)."""
    import socket

    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((n for n in ("lo", "lo0") if n in names), "lo")


def _init_rank(rank: int, world_size: int, backend: str, store_port: int, threads: int):
    import torch
    import torch.distributed as dist

    from playbook.measure import trace

    # Local ranks talk over loopback only. Left alone, gloo binds each rank's device to whatever the
    # hostname resolves to: on a host whose name maps to a routable address, every rank (and the
    # pickled rank results of all_gather_object) would listen there. torchrun ranks keep GLOO_SOCKET_IFNAME
    # as the user sets it (_run_as_torchrun_rank does not come here).
    if backend == "gloo":
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    store = dist.TCPStore("127.0.0.1", store_port, world_size + 1, is_master=False, timeout=timedelta(seconds=60))
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(minutes=30))
    trace.install()
    return device


def _rank_main(rank, world_size, backend, store_port, threads, conn, status, since, lifeline, parent_pid):
    """Entry point of one persistent rank: join the group, then serve calls until told to stop."""
    # Ctrl-C in a terminal, or Jupyter's "interrupt kernel", signals the whole process group: an idle
    # rank must not die of it. The parent handles the interrupt and stops the ranks it was running.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(lifeline, parent_pid)
    lock = threading.Lock()

    def send(message):
        with lock:
            conn.send_bytes(cloudpickle.dumps(message))

    def set_status(text: str) -> None:
        raw = text.encode()[: STATUS_WIDTH - 1]
        status[rank * STATUS_WIDTH : rank * STATUS_WIDTH + len(raw) + 1] = raw + b"\0"
        since[rank] = time.time()

    sys.stdout, sys.stderr = _PrefixedStream(rank, send, "stdout"), _PrefixedStream(rank, send, "stderr")
    try:
        set_status("starting: joining the process group")
        device = _init_rank(rank, world_size, backend, store_port, threads)
    except BaseException:
        send(("error", rank, traceback.format_exc()))
        return
    import torch.distributed as dist

    from playbook.measure.trace import Tracer, label_groups, recording

    set_status("idle")
    send(("ready", rank))
    while True:
        try:
            payload = conn.recv_bytes()
        except EOFError:
            break
        if payload == _STOP:
            break
        tracer = Tracer(rank, on_status=lambda text: set_status(text or "running user code (not in a collective)"))
        label_groups({})  # a mesh used by an earlier call no longer names this call's groups
        ctx = RankContext(rank, world_size, backend, device, dist.group.WORLD, tracer, send)
        set_status("running user code (not in a collective)")
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            with recording(tracer):
                result = fn(ctx, *args, **kwargs)
            sys.stdout.flush(), sys.stderr.flush()
            send(("result", rank, result, [s.as_dict() for s in tracer.spans]))
        except BaseException as exc:
            sys.stdout.flush(), sys.stderr.flush()
            tb = exc.__traceback__.tb_next or exc.__traceback__  # drop this loop's own frame
            send(("error", rank, "".join(traceback.format_exception(type(exc), exc, tb))))
        set_status("idle")
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# in the notebook (the parent)
# ----------------------------------------------------------------------------------------------


_TEMP_PREFIX = "pymp-playbook-"


def _claim_temp_dir() -> None:
    """multiprocessing keeps the forkserver's socket in a ``pymp-XXXX`` folder that only a clean exit
    removes, so a parent killed by SIGKILL leaves it behind. Ours is named ``pymp-playbook-<pid>-…``,
    and every start first removes those whose process is gone. (multiprocessing reads the folder
    from the current process's ``_config["tempdir"]``; its own exit handler still removes it.)"""
    import glob
    import shutil
    import tempfile

    import multiprocessing.util as util

    for path in glob.glob(os.path.join(tempfile.gettempdir(), _TEMP_PREFIX + "*")):
        pid = os.path.basename(path)[len(_TEMP_PREFIX) :].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and _process_state(int(pid)) is None:
            shutil.rmtree(path, ignore_errors=True)
    config = mp.current_process()._config
    if config.get("tempdir") is None:
        folder = tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-")
        util.Finalize(None, util._remove_temp_dir, args=(shutil.rmtree, folder), exitpriority=-100)
        config["tempdir"] = folder


def _forkserver_context():
    _claim_temp_dir()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@contextlib.contextmanager
def _main_module_hidden():
    """Children get their function by value (cloudpickle), so they never need the parent's
    ``__main__``; hiding its path keeps forkserver/spawn from re-running the parent's script."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__.pop(k) for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


def _kill(processes) -> None:
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(timeout=5)


# What a rank's collective raises when the process at the other end is gone (gloo, NCCL, sockets).
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|"
    r"NCCL communicator was aborted|Socket Timeout|ECONNRESET|EPIPE"
)


def _loads(payload: bytes, rank: int):
    """A rank's message, or an ``error`` message naming that rank if the parent cannot unpickle it
    (a result holding a class the parent cannot import, or whose reconstruction raises)."""
    try:
        return cloudpickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is this rank's to report
        return ("error", rank, f"rank {rank}'s message could not be unpickled in the parent: {type(e).__name__}: {e}\n")


def _how_it_ended(code: int | None) -> str:
    """``was killed by SIGKILL (exit -9)``, ``exited with code 3``: a process's end, in words."""
    if code is None:
        return "died"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name} (exit {code})"
        except ValueError:
            return f"was killed by signal {-code} (exit {code})"
    return f"exited with code {code}" + (" without answering" if code == 0 else "")


def _where(status: str) -> str:
    """A rank's status slot (``waiting in all_reduce (20 B, ...) (for 1.0 s)``) as ``during all_reduce``."""
    text = re.sub(r" \(for [\d.]+ s\)$", "", status)
    if text.startswith("waiting in "):
        return f"during {text[len('waiting in ') :].split(' (')[0]}"
    if text.startswith("starting"):
        return "while starting (joining the process group)"
    return f"while {text}" if text else ""


def _rank_list(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _check_options(timeout, error_grace, threads_per_rank, start_method) -> None:
    """Refuse launcher options that cannot work, before any process starts or stops."""
    for name, value, low in (("timeout", timeout, "> 0"), ("error_grace", error_grace, ">= 0")):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        if not ok or (value <= 0 if low == "> 0" else value < 0):
            raise ValueError(
                f"{name} must be a number of seconds {low}, got {value!r}; e.g. {name}={60 if name == 'timeout' else 2}"
            )
    require_positive(threads_per_rank=threads_per_rank)
    if start_method not in mp.get_all_start_methods():
        raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, got {start_method!r}")


def _loopback_store(world_size: int):
    """The rendezvous store, listening on 127.0.0.1 only. ``TCPStore("127.0.0.1", 0, is_master=True)``
    binds every interface (``*:port``), which lets any host on the network talk to the ranks'
    rendezvous; a socket we bind to loopback ourselves and hand over (``master_listen_fd``) does not.
    The OS picks the port, so no port is ever assumed free."""
    import socket

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(max(128, 2 * world_size))
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the descriptor from here on and closes it with itself
    return dist.TCPStore(
        "127.0.0.1", port, world_size + 1, is_master=True, wait_for_workers=False, master_listen_fd=fd, use_libuv=True
    )


class Ranks:
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

    def _status_of(self, rank: int) -> str:
        raw = bytes(self._status[rank * STATUS_WIDTH : (rank + 1) * STATUS_WIDTH]).split(b"\0")[0]
        waited = time.time() - self._since[rank] if self._since[rank] else 0.0
        return f"{raw.decode(errors='replace')} (for {waited:.1f} s)"

    def _collect(self, kind: str, timeout: float, progress: bool = False) -> list:
        """Gather one ``kind`` message per rank, printing rank output and feeding the progress bar."""
        results: dict[int, Any] = {}
        traces: dict[int, list] = {}
        failures: dict[int, str] = {}  # in the order they reached us
        deaths: dict[int, tuple[int | None, str]] = {}  # rank -> (exit code, what it was doing)
        bar = _ProgressBar(self.world_size) if progress else None
        deadline = time.monotonic() + timeout
        failed_at = None
        next_look, stalled = time.monotonic() + 1.0, set()  # ranks already reported as making no progress
        conn_rank = {conn: r for r, conn in enumerate(self._conns)}
        sentinel_rank = {p.sentinel: r for r, p in enumerate(self.processes)}
        try:
            while len(results) + len(failures) < self.world_size:
                now = time.monotonic()
                if failed_at is not None and now - failed_at > self.error_grace:
                    break
                if now > deadline:
                    waiting = {r: self._status_of(r) for r in range(self.world_size) if r not in results}
                    raise RankTimeout(timeout, waiting, self._restart)
                if now >= next_look:
                    next_look = now + 1.0
                    self._say_if_stalled(results, failures, stalled, timeout)
                ready = mp.connection.wait(list(conn_rank) + list(sentinel_rank), timeout=0.1)
                for obj in sorted(ready, key=lambda o: o not in sentinel_rank):  # deaths first: they explain the rest
                    if obj in sentinel_rank:
                        r = sentinel_rank.pop(obj)
                        if (
                            r not in results
                            and r not in failures
                            and not self._drain(r, conn_rank, results, traces, failures, bar, kind)
                        ):
                            self.processes[r].join(timeout=1.0)
                            code = self.processes[r].exitcode
                            deaths[r] = (code, self._status_of(r))
                            failures[r] = f"rank {r} {_how_it_ended(code)} before answering\n"
                            failed_at = failed_at or time.monotonic()
                        continue
                    if obj not in conn_rank:
                        continue
                    try:
                        self._handle(_loads(obj.recv_bytes(), conn_rank[obj]), kind, results, traces, failures, bar)
                    except (EOFError, OSError):  # closed or reset: the rank is gone; its sentinel says how
                        conn_rank.pop(obj)
                    if failures and failed_at is None:
                        failed_at = time.monotonic()
        finally:
            if bar is not None:
                bar.close()
        if failures:
            raise self._blame(failures, deaths, results)
        if kind == "result":
            self.last_trace = [span for r in range(self.world_size) for span in traces.get(r, [])]
        return [results[r] for r in range(self.world_size)]

    def write_trace(self, path, *, title: str = "playbook ranks"):
        """Write the last call's spans of every rank (``last_trace``) as a Chrome trace, to open in
        Perfetto (https://ui.perfetto.dev) or ``chrome://tracing``: one row per rank, compute and
        communication threads, a flow arrow from each send to its receive. Returns the path."""
        from playbook.measure.chrome_trace import write_chrome_trace

        return write_chrome_trace(path, self.last_trace, title=title)

    def _say_if_stalled(self, results, failures, stalled: set, timeout: float) -> None:
        """One line per rank that stopped making progress: a process the OS has stopped (SIGSTOP,
        state T), or one whose status has not changed for ``stall_after`` seconds; the call still
        ends at ``timeout`` (``playbook run --timeout``) with the usual report."""
        for r, p in enumerate(self.processes):
            if r in results or r in failures or r in stalled:
                continue
            state = _process_state(p.pid) if p.pid else None
            quiet = time.time() - self._since[r] if self._since[r] else 0.0
            if state is not None and state[0] == "T":
                why = "is stopped (SIGSTOP or a debugger: process state T)"
            elif quiet > self.stall_after:
                why = f"has made no progress for {quiet:.0f} s"
            else:
                continue
            stalled.add(r)
            print(
                f"playbook: rank {r} {why}, {_where(self._status_of(r))}; the call gives up after {timeout:g} s "
                "(playbook run --timeout, Ranks(timeout=))",
                file=sys.stderr,
                flush=True,
            )

    def _blame(self, failures: dict[int, str], deaths: dict, results: dict) -> RankError:
        """One error that names the cause: a rank that died comes before the ranks that then lost
        their connection to it ("Connection closed by peer" is a symptom, not a cause); otherwise
        the first rank that raised."""
        stuck = [r for r in range(self.world_size) if r not in results and r not in failures]
        lost = [r for r, tb in failures.items() if r not in deaths and _PEER_LOST.search(tb)]
        raised = [r for r in failures if r not in deaths and r not in lost]
        first = next(iter(deaths), None)
        if first is None:
            first = raised[0] if raised else lost[0]
        note = ""
        if stuck:
            where = "\n".join(f"  rank {r}: {self._status_of(r)}" for r in stuck)
            note = f"\n--- the other ranks were still busy, so all ranks were killed{self._restart} ---\n{where}\n"
        if first in deaths:
            code, status = deaths[first]
            parts = [f"rank {first} {_how_it_ended(code)} {_where(status)}".rstrip()]
            if len(deaths) > 1:
                others = sorted(set(deaths) - {first})
                parts.append(
                    f"{_rank_list(others)} {'died' if len(others) > 1 else _how_it_ended(deaths[others[0]][0])} too"
                )
            if lost:
                parts.append(f"{_rank_list(sorted(lost))} lost {'its' if len(lost) == 1 else 'their'} peer")
            if raised:
                parts.append(f"{_rank_list(sorted(raised))} raised: {failures[raised[0]].strip().splitlines()[-1]}")
            if stuck:
                parts.append(f"{_rank_list(stuck)} {'was' if len(stuck) == 1 else 'were'} left waiting")
            return RankError(first, "", note, headline="; ".join(parts), exitcode=code)
        others = sorted(set(failures) - {first})
        if lost and first not in lost:
            note += f"\n({_rank_list(sorted(lost))} then lost {'its' if len(lost) == 1 else 'their'} peer; rank {first} is shown)\n"
        elif others:
            note += f"\n(ranks {others} failed too; rank {first} is shown)\n"
        return RankError(first, failures[first], note)

    def _drain(self, r, conn_rank, results, traces, failures, bar, kind) -> bool:
        """Read what a rank that just exited had still queued; True if that answered it."""
        conn = self._conns[r]
        try:
            while conn.poll():
                self._handle(_loads(conn.recv_bytes(), r), kind, results, traces, failures, bar)
        except (EOFError, OSError):
            pass
        conn_rank.pop(conn, None)
        return r in results or r in failures

    @staticmethod
    def _handle(message, kind, results, traces, failures, bar) -> None:
        tag, rank = message[0], message[1]
        if tag == "print":
            stream = sys.stdout if rank == "stdout" else sys.stderr
            stream.write(message[2])
            stream.flush()
        elif tag == "progress" and bar is not None:
            bar.update(*message[1:])
        elif tag == "error":
            failures[rank] = message[2]
        elif tag == kind == "ready":
            results[rank] = None
        elif tag == kind == "result":
            results[rank], traces[rank] = message[2], message[3]


_progress_off = [0]  # > 0 inside ``no_progress()``: every rank set's bar stays silent


@contextlib.contextmanager
def no_progress():
    """No progress bars while the block runs, whoever starts the ranks (``playbook run --json``)."""
    _progress_off[0] += 1
    try:
        yield
    finally:
        _progress_off[0] -= 1


class _ProgressBar:
    """A tqdm bar (a widget in Jupyter) that follows the slowest rank."""

    def __init__(self, world_size: int):
        self.done = [0] * world_size
        self.bar = None

    def update(self, rank: int, done: int, total: int, desc: str) -> None:
        if _progress_off[0]:
            return
        from tqdm.auto import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=desc or "ranks", leave=False)
        self.done[rank] = done
        self.bar.n = min(self.done)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------------------------
# the shared set for a notebook, the fresh launch, and torchrun
# ----------------------------------------------------------------------------------------------

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


@atexit.register
def _stop_shared() -> None:
    for r in _shared.values():
        r.stop()


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


_launch_timeout = [300.0]  # seconds a fresh launch() waits for every result, unless told otherwise


@contextlib.contextmanager
def launch_timeout(seconds: float):
    """Every ``launch()`` inside the block waits at most ``seconds`` for its ranks (``playbook run
    --timeout``: the strategies call ``launch`` themselves)."""
    _check_options(seconds, 0.0, 1, "fork")
    saved, _launch_timeout[0] = _launch_timeout[0], seconds
    try:
        yield
    finally:
        _launch_timeout[0] = saved


def launch(
    fn: Callable, world_size: int | None = None, *args, backend: str = "auto", timeout: float | None = None, **kwargs
) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on fresh ranks and stop them; return every rank's result.

    Under ``torchrun`` this process *is* one rank: the group is joined from the environment,
    ``fn`` runs here, and every rank gets the list of all results (``world_size`` may be None).
    """
    if under_torchrun():
        return _run_as_torchrun_rank(fn, world_size, backend, *args, **kwargs)
    if world_size is None:
        raise ValueError("world_size is required outside torchrun")
    r = Ranks(world_size, backend=backend, timeout=_launch_timeout[0] if timeout is None else timeout)
    r._restart = ""  # one run: nothing restarts afterwards
    with r:
        results = r.run(fn, *args, **kwargs)
    LAUNCHED_TRACES.append(r.last_trace)
    return results


LAUNCHED_TRACES: list[list[dict]] = []  # the spans of every rank of each launch, in order (``run --trace``)


def _run_as_torchrun_rank(fn, world_size, backend, *args, **kwargs) -> list:
    import torch
    import torch.distributed as dist

    from playbook.measure import trace

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
        dist.init_process_group(backend)
    trace.install()
    tracer = trace.Tracer(dist.get_rank())
    ctx = RankContext(dist.get_rank(), env_world, backend, device, dist.group.WORLD, tracer)
    with trace.recording(tracer):
        result = fn(ctx, *args, **kwargs)
    everyone = [None] * env_world
    dist.all_gather_object(everyone, result)
    return everyone
