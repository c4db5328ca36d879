"""Run: inside a rank. The entry point each rank process runs (join the group, then serve calls),
the context a rank function receives, and the watchdog that ends a rank with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import cloudpickle

_STOP = b"stop"  # the message that ends a rank's loop (a job is always a cloudpickle payload)
STATUS_WIDTH = 160  # bytes of status text per rank, in shared memory


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
        from playbook.cluster.mesh import world_mesh

        return world_mesh()

    def mesh_for(self, dims):
        """This rank's :class:`~playbook.cluster.mesh.Mesh` for a ``ParallelDims`` (built once per rank set)."""
        from playbook.cluster.mesh import build_mesh

        return build_mesh(dims)

    def progress(self, done: int, total: int, desc: str = "") -> None:
        now = time.monotonic()
        if self._send is not None and (done >= total or now - self._last_progress > 0.1):
            self._last_progress = now
            self._send(("progress", self.rank, done, total, desc))


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

    from playbook.cluster.trace import tracer as trace

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

    from playbook.cluster.trace.tracer import Tracer, label_groups, recording

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
