"""Issue 31, signals and faults: SIGTERM is treated like Ctrl-C (ranks stopped, one line, exit
143), no ``pymp-*`` folder is left (a parent killed by SIGKILL leaves one that the next start
sweeps), a frozen rank is named within ``--timeout``, and a result that cannot be unpickled names
its rank."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import pids_marked

ROOT = Path(__file__).resolve().parents[2]


def _wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start_run(tmp_path, marker, *extra):
    env = {**os.environ, "PLAYBOOK_TEST_MARK": marker, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "playbook.cli", "run", "dp", "--world-size", "2", "--steps", "10000", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = _wait(lambda: len(pids_marked(marker)) >= 4, 90)  # the CLI, the forkserver, two ranks
    assert started, (
        f"the ranks never started: {proc.poll()} {proc.stderr.read()[-2000:] if proc.poll() is not None else ''}"
    )
    time.sleep(0.5)
    return proc, env


@pytest.fixture
def tmp_path():  # a short folder: the forkserver's socket path must fit AF_UNIX's 108 bytes
    folder = tempfile.mkdtemp(prefix="pb31-", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _cleanup(marker, proc):
    for pid in pids_marked(marker):
        os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_stops_the_ranks_with_one_line_and_exit_143(tmp_path):
    marker = f"playbook-sigterm-{os.getpid()}-{time.monotonic_ns()}"
    proc, _ = _start_run(tmp_path, marker)
    try:
        assert glob.glob(str(tmp_path / "pymp-*")), "multiprocessing's folder should exist while running"
        proc.send_signal(signal.SIGTERM)  # what timeout, kill and Slurm send: to the CLI alone
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err[-2000:]
        assert err.strip().splitlines()[-1] == "playbook: terminated (SIGTERM); every rank was stopped", err[-2000:]
        assert "Traceback" not in err
        assert _wait(lambda: not pids_marked(marker), 10), pids_marked(marker)
        assert not glob.glob(str(tmp_path / "pymp-*")), os.listdir(tmp_path)
    finally:
        _cleanup(marker, proc)


def test_the_folder_a_sigkilled_parent_left_is_swept_by_the_next_start(tmp_path, monkeypatch):
    from playbook.cluster import launch

    marker = f"playbook-sigkill-{os.getpid()}-{time.monotonic_ns()}"
    proc, _ = _start_run(tmp_path, marker)
    try:
        proc.kill()
        proc.wait()
        assert _wait(lambda: not pids_marked(marker), 15), "ranks outlived their parent"
        assert glob.glob(str(tmp_path / "pymp-playbook-*")), "a SIGKILL leaves the folder (nothing can run)"
        # the next start, here in this process (a fresh interpreter costs seconds): every start sweeps
        # the temporary folder, where the dead parent's folder now lies. This process's own folder
        # (and forkserver) is claimed first, where it always is, so it is not made in tmp_path.
        assert launch(lambda ctx: ctx.rank, 1, backend="gloo") == [0]
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        assert launch(lambda ctx: ctx.rank, 1, backend="gloo") == [0]
        assert not glob.glob(str(tmp_path / "pymp-*")), os.listdir(tmp_path)
    finally:
        _cleanup(marker, proc)


# ---- a result the parent cannot unpickle; a frozen rank; --timeout ----------------------------
def unpicklable_on_1(ctx):
    class Bad:
        def __reduce__(self):  # rebuilt in the parent as int("not a number"): raises there
            return (int, ("not a number",))

    return Bad() if ctx.rank == 1 else ctx.rank


def test_a_result_that_cannot_be_unpickled_names_its_rank():
    from playbook.cluster import RankError, launch

    with pytest.raises(RankError) as err:
        launch(unpicklable_on_1, 2, backend="gloo", timeout=60)
    assert err.value.rank == 1
    assert "rank 1's message could not be unpickled in the parent: ValueError" in str(err.value).splitlines()[0]


def freeze_1(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(2), group=ctx.group)


def test_a_frozen_rank_is_named_at_once_and_the_call_ends_at_its_timeout(capfd):
    from playbook.cluster import Ranks, RankTimeout

    with Ranks(2, backend="gloo", timeout=6) as ranks:
        t0 = time.monotonic()
        with pytest.raises(RankTimeout, match="within 6 s"):
            ranks.run(freeze_1)
        assert time.monotonic() - t0 < 6 + 15
    err = capfd.readouterr().err
    assert "playbook: rank 1 is stopped (SIGSTOP or a debugger: process state T)" in err, err


def test_a_launchers_timeout_bounds_the_strategies_launches():
    from playbook.cluster import Launcher, RankTimeout

    def hang(ctx):
        time.sleep(60)

    launch = Launcher(timeout=1.5)  # what ``playbook run --timeout 1.5`` hands the strategy's run
    t0 = time.monotonic()
    with pytest.raises(RankTimeout, match="within 1.5 s"):
        launch(hang, 1, backend="gloo")
    assert time.monotonic() - t0 < 1.5 + 15


def test_run_timeout_is_checked_like_every_number(capsys):
    from playbook.cli import main

    assert main(["run", "dp", "--timeout", "0"]) == 2
    assert "--timeout must be between 0.1 and 86400, got 0; e.g. --timeout 60" in capsys.readouterr().err
