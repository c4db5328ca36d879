"""Faults and bad input: every one ends in seconds, with one message that names the cause, and
leaves no process behind.

Ranks: one raising, one exiting, one killed mid-collective, one hanging in a collective, one
spinning in Python; an interrupted call; interrupts reaching idle ranks; a parent that dies and
is never reaped; the rendezvous store's bind address; ``ranks()`` options. The command line: a
table of bad numbers, each refused with exit 2 and one line before any rank starts.
"""

import _thread
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from playbook import cluster
from playbook.cluster.launch import _shared
from playbook.cluster import RankError, Ranks, RankTimeout
from tests.conftest import pid_alive, pids_marked

LOOSE = 15.0  # seconds of slack on a shared 2-core machine; the process group's own timeout is 30 minutes


def wait_gone(pids, seconds=10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - the fault is the point
        return e, time.perf_counter() - t0
    raise AssertionError("the fault raised nothing")


# ---- a rank raises, exits, is killed, hangs, spins ---------------------------------------------
def raise_on_1(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        raise ValueError("deliberate")
    dist.all_reduce(torch.ones(2), group=ctx.group)


def test_a_rank_that_raises_is_named_with_its_traceback(ranks2):
    old = ranks2.pids()
    err, seconds = timed(ranks2.run, raise_on_1)
    assert isinstance(err, RankError) and err.rank == 1, err
    assert str(err).startswith("rank 1 failed: ValueError: deliberate")
    assert "rank 0: waiting in all_reduce" in str(err)
    assert seconds < ranks2.error_grace + LOOSE
    assert wait_gone(old) == []


def test_a_rank_that_exits_is_named_with_its_exit_code(ranks2):
    old = ranks2.pids()
    err, seconds = timed(ranks2.run, lambda ctx: os._exit(3) if ctx.rank == 1 else time.sleep(30))
    assert isinstance(err, RankError) and err.rank == 1 and err.exitcode == 3
    assert str(err).startswith("rank 1 exited with code 3 while running user code"), str(err)
    assert seconds < ranks2.error_grace + LOOSE
    assert wait_gone(old) == []


def wait_then_all_reduce(ctx, killed: str):
    import torch.distributed as dist

    if ctx.rank == 0:  # rank 1 is waiting in the all-reduce when it is killed; rank 0 joins only after
        deadline = time.monotonic() + 60
        while not os.path.exists(killed) and time.monotonic() < deadline:
            time.sleep(0.01)
    dist.all_reduce(torch.ones(2), group=ctx.group)


def kill_once_waiting(ranks, rank: int, what: str, killed: str, when: dict) -> None:
    """SIGKILL ``rank`` as soon as its status says it waits in ``what``, then tell the others (a fixed
    delay raced a busy machine's start-up: the rank was killed before it reached the collective)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and f"waiting in {what}" not in ranks._status_of(rank):
        time.sleep(0.01)
    os.kill(ranks.pids()[rank], signal.SIGKILL)
    when["killed"] = time.perf_counter()
    open(killed, "w").close()


def test_a_killed_rank_is_blamed_not_the_survivor_that_lost_it(ranks2, tmp_path):
    """Rank 0 sees "Connection closed by peer": that is the symptom, rank 1's death the cause."""
    old, killed, when = ranks2.pids(), str(tmp_path / "killed"), {}
    threading.Thread(target=kill_once_waiting, args=(ranks2, 1, "all_reduce", killed, when), daemon=True).start()
    err, _ = timed(ranks2.run, wait_then_all_reduce, killed)
    assert isinstance(err, RankError) and err.rank == 1 and err.exitcode == -signal.SIGKILL, str(err)
    assert str(err).startswith("rank 1 was killed by SIGKILL (exit -9) during all_reduce; rank 0 lost its peer"), str(
        err
    )
    assert time.perf_counter() - when["killed"] < ranks2.error_grace + LOOSE  # named soon after the death
    assert wait_gone(old) == []


def hang_in_all_reduce(ctx):
    import torch.distributed as dist

    if ctx.rank == 0:
        time.sleep(60)
    dist.all_reduce(torch.ones(2), group=ctx.group)


def test_a_rank_hanging_in_a_collective_times_out_naming_it(ranks2):
    old = ranks2.pids()
    err, seconds = timed(ranks2.run, hang_in_all_reduce, timeout=3.0)
    assert isinstance(err, RankTimeout), err
    assert err.waiting[1].startswith("waiting in all_reduce (8 B")
    assert "not in a collective" in err.waiting[0]
    assert seconds < 3.0 + LOOSE
    assert wait_gone(old) == []


def spin(ctx):
    while True:
        pass


def test_a_rank_spinning_in_python_times_out_and_is_killed(ranks2):
    old = ranks2.pids()
    err, seconds = timed(ranks2.run, spin, timeout=2.0)
    assert isinstance(err, RankTimeout) and "not in a collective" in err.waiting[0]
    assert seconds < 2.0 + LOOSE
    assert wait_gone(old) == []
    assert ranks2.run(lambda ctx: ctx.rank) == [0, 1]


def test_a_one_shot_launch_does_not_promise_a_restart():
    err, _ = timed(cluster.launch, raise_on_1, 2, backend="gloo", timeout=30)
    assert isinstance(err, RankError) and "restart" not in str(err), str(err)


# ---- interrupts ---------------------------------------------------------------------------------
def test_an_interrupted_call_leaves_no_rank(ranks2):
    old = ranks2.pids()
    threading.Timer(0.5, _thread.interrupt_main).start()
    err, seconds = timed(ranks2.run, lambda ctx: time.sleep(30))
    assert isinstance(err, KeyboardInterrupt)
    assert seconds < LOOSE
    assert wait_gone(old) == []


def test_an_interrupt_reaching_idle_ranks_does_not_kill_them(ranks2, capfd):
    """Jupyter's "interrupt kernel" and a terminal's Ctrl-C signal the whole process group."""
    before = ranks2.pids()
    for pid in before:
        os.kill(pid, signal.SIGINT)
    time.sleep(1.0)
    assert all(pid_alive(p) for p in before)
    assert ranks2.run(lambda ctx: ctx.rank) == [0, 1]
    assert ranks2.pids() == before


def test_ranks_that_died_while_idle_are_restarted_with_a_word(ranks2, capfd):
    before = ranks2.pids()
    os.kill(before[1], signal.SIGKILL)
    assert wait_gone(before[1:]) == []
    deadline = time.monotonic() + 10
    while ranks2.alive and time.monotonic() < deadline:  # the forkserver reports the exit a moment later
        time.sleep(0.05)
    capfd.readouterr()
    assert ranks2.run(lambda ctx: ctx.rank) == [0, 1]
    assert (
        "had stopped while idle (rank 1 was killed by SIGKILL (exit -9)); starting them again" in capfd.readouterr().err
    )
    assert wait_gone(before) == []


def test_a_rank_killed_just_before_a_call_is_named(ranks2):
    """Killed while idle, before the launcher has heard of it: the call fails naming it, not with
    a ConnectionResetError from the pipe, and the next call restarts the set."""
    before = ranks2.pids()
    os.kill(before[1], signal.SIGKILL)
    try:
        assert ranks2.run(lambda ctx: ctx.rank) == [0, 1]  # the death was noticed in time: restarted
    except RankError as err:
        assert err.rank == 1 and str(err).startswith("rank 1 was killed by SIGKILL (exit -9)"), str(err)
    assert wait_gone(before[1:]) == []
    assert ranks2.run(lambda ctx: ctx.rank) == [0, 1]


# ---- a parent that dies and is not reaped -------------------------------------------------------
SUPERVISOR = """
import os, signal, sys, time
from playbook.cluster import Ranks
r = Ranks(2, backend="gloo").start()
helper = os.fork()  # a long-lived child of the parent (a kernel has such), holding every inherited fd
if helper == 0:
    time.sleep(60)
    os._exit(0)
print(*r.pids(), helper, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # dies; its own parent (this test) does not reap it yet
"""


def test_ranks_die_with_a_parent_that_is_a_zombie(tmp_path):
    """``kill(pid, 0)`` succeeds on a zombie, and the forkserver (the ranks' actual parent) lives on
    while any child of the dead parent holds its pipe: neither may keep the ranks alive."""
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True)
    try:
        *pids, helper = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.2)
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not reaped
        assert wait_gone(pids, seconds=5.0) == []
    finally:
        for pid in [*locals().get("pids", []), locals().get("helper")]:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait(timeout=10)


# ---- the rendezvous store ---------------------------------------------------------------------
def listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)
            for line in f:
                local, _, state = line.split()[1:4]
                address, hexport = local.split(":")
                if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    found.append(address)
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def test_the_store_listens_on_loopback_only(ranks2):
    port = ranks2._store.port
    found = listening_addresses(port)
    assert found, f"nothing listens on the store's port {port}"
    assert set(found) <= LOOPBACK, f"the store listens on {found} (every interface), not loopback"
    assert ranks2.run(lambda ctx: ctx.rank) == [0, 1]


# ---- ranks(): options ----------------------------------------------------------------------------
@pytest.fixture
def shared_slot():
    saved = _shared.pop("ranks", None)
    yield
    r = _shared.pop("ranks", None)
    if r is not None:
        r.stop()
    if saved is not None:
        _shared["ranks"] = saved


def test_ranks_applies_new_options_and_a_refusal_leaves_the_set_running(shared_slot, capfd):
    first = cluster.ranks(2, backend="gloo")
    pids = first.pids()
    again = cluster.ranks(2, backend="gloo", timeout=5)
    assert again is first and again.timeout == 5 and again.pids() == pids  # applied, no restart
    assert cluster.ranks(2, backend="gloo").timeout == 5  # left out: kept
    for bad, message in [
        (dict(world_size=10_000), "try world_size in"),
        (dict(world_size=2, timeout=0), "timeout must be a number of seconds > 0"),
        (dict(world_size=2, timeout=float("nan")), "timeout must be a number of seconds > 0"),
        (dict(world_size=2, threads_per_rank=0), "threads_per_rank must be a positive integer"),
        (dict(world_size=2, backend="mpi"), "backend must be 'auto', 'gloo' or 'nccl'"),
    ]:
        options = {"backend": "gloo"} | bad
        with pytest.raises(ValueError, match=message):
            cluster.ranks(options.pop("world_size"), **options)
        assert first.alive and first.pids() == pids, bad
    with pytest.raises(TypeError, match="unknown option"):
        cluster.ranks(2, backend="gloo", timout=5)
    assert first.alive and first.pids() == pids
    capfd.readouterr()
    changed = cluster.ranks(2, backend="gloo", threads_per_rank=2)
    assert "restarting the 2 ranks: threads_per_rank 1 -> 2" in capfd.readouterr().err
    assert changed.threads_per_rank == 2 and changed.timeout == 5 and wait_gone(pids) == []
    assert changed.run(lambda ctx: torch.get_num_threads()) == [2, 2]


def test_a_call_timeout_must_be_positive(ranks2):
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        ranks2.run(lambda ctx: 0, timeout=0)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        Ranks(2, backend="gloo", timeout=-1)


# ---- the command line: bad numbers, impossible sizes, interrupts --------------------------------
BAD_NUMBERS = [
    (["run", "dp", "--lr", "nan"], "--lr must be a finite number"),
    (["run", "dp", "--lr", "-1"], "--lr must be greater than 0 and at most 1"),
    (["run", "dp", "--lr", "inf"], "--lr must be a finite number"),
    (["run", "dp", "--lr", "1e30"], "--lr must be greater than 0 and at most 1"),
    (["run", "dp", "--bucket-mb", "inf"], "--bucket-mb must be a finite number"),
    (["run", "dp", "--bucket-mb", "0"], "--bucket-mb must be greater than 0"),
    (["run", "dp", "--accumulate", "0"], "--accumulate must be between 1 and"),
    (["run", "ep", "--capacity-factor", "inf"], "--capacity-factor must be a finite number"),
    (["run", "ep", "--aux-alpha", "nan"], "--aux-alpha must be a finite number"),
    (["run", "ep", "--top-k", "0"], "--top-k must be between 1 and"),
    (["run", "ep", "--experts", "0"], "--experts must be between 1 and"),
    (["run", "ep", "--ep", "0"], "--ep must be a positive integer"),
    (["run", "pp", "--microbatches", "0"], "--microbatches must be between 1 and"),
    (["run", "zero", "--stage", "7"], "--stage must be between 0 and 3"),
    (["run", "dp", "--world-size", "0"], "--world-size must be a positive integer"),
    (["run", "dp", "--steps", "0"], "--steps must be between 1 and"),
    (["run", "single", "--model", "llama-3.1-405b"], "needs 6.5 TB per rank"),
    (["run", "single", "--global-batch", "1000000"], "try --global-batch"),
    # a prediction past the RoPE table is planned with a note (RoPE scaling assumed); a run on ranks is refused
    (["run", "single", "--seq-len", "10000000"], "exceeds gpt-tiny's max_seq_len=64"),
    (["memory", "--dp", "0"], "--dp must be a positive integer"),
]


@pytest.mark.parametrize("argv, message", BAD_NUMBERS, ids=[" ".join(a) for a, _ in BAD_NUMBERS])
def test_bad_numbers_get_one_line_and_exit_2_before_any_rank_starts(argv, message, capsys, monkeypatch):
    from playbook import cli

    def refuse_to_start(self):
        raise AssertionError(f"ranks were started for {argv}")

    monkeypatch.setattr(cluster.Ranks, "start", refuse_to_start)
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("playbook: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_memory_and_info_do_not_import_the_strategies():
    code = (
        "import sys; from playbook.cli import main; main(['memory', '--json']); "
        "print(sorted(m for m in ('torch.distributed', 'playbook.parallel.dp.ddp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().endswith("[]"), out.stdout[-300:] + out.stderr[-2000:]


def test_help_shows_defaults_and_world_size_defaults_to_two(capsys):
    from playbook import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "dp", "--help"])
    out = capsys.readouterr().out
    assert "(default: 2)" in out and "default: bucketed" in out
    assert cli.build_parser().parse_args(["run", "cp"]).world_size == 2
    assert cli.build_parser().parse_args(["run", "single"]).world_size == 1


def test_json_prints_only_json_on_stdout(capsys):
    """Rank prints go to stderr and progress bars nowhere, so `playbook run X --json | jq` works."""
    import json

    from playbook import cli
    from playbook.parallel import registry
    from playbook.parallel.report import RunReport

    def noisy(ctx):
        print("hello from a rank")
        ctx.progress(1, 1, "steps")
        return ctx.rank

    @registry.register("noisy-test", help="prints from a rank")
    def run_noisy(setup, *, world_size, backend, launch):
        launch(noisy, world_size, backend="gloo")  # the command's launcher: --json turns its bar off
        return RunReport("noisy-test", world_size, "gloo", parity={})

    try:
        assert cli.main(["run", "noisy-test", "--json"]) == 0
    finally:
        registry._registry.pop("noisy-test")
    captured = capsys.readouterr()
    assert json.loads(captured.out)["strategy"] == "noisy-test"
    assert "hello from a rank" in captured.err and "steps" not in captured.err


def test_ctrl_c_during_run_exits_with_one_line_and_leaves_nothing(tmp_path):
    marker = f"playbook-ctrl-c-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PLAYBOOK_TEST_MARK": marker, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "playbook.cli", "run", "dp", "--world-size", "2", "--steps", "10000"]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )

    def marked() -> list[int]:
        return pids_marked(marker)

    try:
        deadline = time.monotonic() + 60
        while len(marked()) < 4 and time.monotonic() < deadline:  # the CLI, the forkserver, two ranks
            time.sleep(0.2)
        assert len(marked()) >= 4, "the ranks never started"
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err[-2000:]
        assert err.strip().splitlines()[-1] == "playbook: interrupted; every rank was stopped", err[-2000:]
        assert "Traceback" not in err, err[-3000:]
        assert wait_gone(marked(), seconds=10) == []
    finally:
        for pid in marked():
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a GPU is visible")
def test_nccl_without_any_gpu_does_not_suggest_world_size_zero():
    with pytest.raises(ValueError) as info:
        cluster.check_world_size(2, "nccl")
    assert "no GPU is visible" in str(info.value) and "world_size <= 0" not in str(info.value)
