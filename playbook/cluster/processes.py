"""Run: the parent's side of starting rank processes: the forkserver (torch imported once), its
temporary folder, the loopback rendezvous store, and killing what is left."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys

import cloudpickle

from playbook.cluster.rank import _process_state

PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.pipelining",
    "playbook.cluster",
    "playbook.cluster.trace.tracer",
]


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


def _loads(payload: bytes, rank: int):
    """A rank's message, or an ``error`` message naming that rank if the parent cannot unpickle it
    (a result holding a class the parent cannot import, or whose reconstruction raises)."""
    try:
        return cloudpickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is this rank's to report
        return ("error", rank, f"rank {rank}'s message could not be unpickled in the parent: {type(e).__name__}: {e}\n")


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
