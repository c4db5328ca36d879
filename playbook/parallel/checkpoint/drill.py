"""The failure drill: a hybrid run under ``torchrun --max-restarts N`` (PyTorch's elastic agent), one
rank killed mid-run, the job restarted by the agent and resumed from its last checkpoint.

At scale failures are routine (Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs,
Dubey et al. 2024, §3.3.4), so a job is written to be restarted: one command line, the same on
every attempt, that saves every K steps and resumes from the latest checkpoint if there is one
(``--save DIR --resume DIR``). The elastic agent notices a worker's death (it polls its workers
every ``--monitor-interval`` seconds), stops the others, and starts every worker again
(TorchElastic; restart count in ``TORCHELASTIC_RESTART_COUNT``); they rendezvous, load and go on.

:func:`drill` runs that on this machine: it starts torchrun, waits for rank 0's event log
(``session.EVENTS``) to show step ``kill_after`` done, SIGKILLs the worker with ``RANK=1``, and after
the job ends reads the log: time to detect and restart (the kill to the next attempt's start),
to reload (the load itself), and the work lost (steps done since the last save, and their seconds).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from playbook.parallel.checkpoint.session import EVENTS, HOLD

MARK = "PLAYBOOK_DRILL"


@dataclass
class Drill:
    """What the drill measured (seconds, wall clock) and the job's exit status and output."""

    returncode: int
    killed_at_step: int
    detect_seconds: float  # the kill -> the agent's log line naming the dead worker
    restart_seconds: float  # the kill -> the next attempt's first event (detect, stop, restart, rendezvous, imports)
    reload_seconds: float  # the load of the last checkpoint
    steps_lost: int  # steps done after the last save, done again
    seconds_lost: float  # the last save -> the kill: work thrown away
    attempts: int
    report: dict | None
    stderr: str

    def table(self) -> list[dict]:
        return [
            {"measured": "killed after step", "value": self.killed_at_step},
            {"measured": "detect (s)", "value": round(self.detect_seconds, 2)},
            {"measured": "detect + restart (s)", "value": round(self.restart_seconds, 2)},
            {"measured": "reload (s)", "value": round(self.reload_seconds, 3)},
            {"measured": "steps lost", "value": self.steps_lost},
            {"measured": "work lost (s)", "value": round(self.seconds_lost, 2)},
            {"measured": "attempts", "value": self.attempts},
        ]


_FAILED = re.compile(r"^[EW](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*failed \(exitcode: -9\)", re.M)


def _detected(stderr: str, killed_at: float) -> float:
    """When the agent logged the killed worker's failure (glog's local time, the kill's year), or NaN."""
    m = _FAILED.search(stderr)
    if not m:
        return float("nan")
    month, day, h, mi, sec = m.groups()
    year = datetime.datetime.fromtimestamp(killed_at).year
    when = datetime.datetime(year, int(month), int(day), int(h), int(mi), int(float(sec)), int(float(sec) % 1 * 1e6))
    return when.timestamp()


def events(folder: str | Path) -> list[dict]:
    path = Path(folder) / EVENTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _worker(mark: str, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` in the job marked ``mark`` (None if not found)."""
    want = {f"{MARK}={mark}".encode(), f"RANK={rank}".encode()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env and b"TORCHELASTIC_RESTART_COUNT=0" in env:
            return int(pid)
    return None


def drill(
    folder: str | Path,
    layout: list[str],
    *,
    steps: int = 6,
    save_every: int = 2,
    kill_after: int = 3,
    max_restarts: int = 1,
    timeout: float = 300.0,
    python: str = sys.executable,
) -> Drill:
    """Run ``playbook run hybrid <layout> --steps steps --save folder --save-every K --resume folder
    --json`` under torchrun, kill rank 1 once step ``kill_after`` is done, and measure the recovery."""
    folder = Path(folder)
    world = 1
    for flag, value in zip(layout[::2], layout[1::2]):
        world *= int(value) if flag in ("--dp", "--tp", "--pp", "--cp") else 1
    mark = uuid.uuid4().hex
    # HOLD: the first attempt's ranks wait after step kill_after, so the kill lands there and not a step
    # later on a loaded machine (the kill itself is a real SIGKILL of a real worker)
    env = {**os.environ, MARK: mark, HOLD: str(kill_after), "OMP_NUM_THREADS": "1"}
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    cmd += ["--max-restarts", str(max_restarts), "--monitor-interval", "0.1", "-m", "playbook.cli", "run", "hybrid"]
    cmd += [*layout, "--steps", str(steps), "--save", str(folder), "--save-every", str(save_every)]
    cmd += ["--resume", str(folder), "--json"]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed_at, deadline = None, time.monotonic() + timeout
    try:
        while killed_at is None and job.poll() is None and time.monotonic() < deadline:
            if any(e["event"] == "step" and e["step"] >= kill_after for e in events(folder)):
                pid = _worker(mark, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.time()
                    break
            time.sleep(0.02)
        out, err = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    log = events(folder)
    starts = [e for e in log if e["event"] == "start"]
    after = [e for e in starts if killed_at is not None and e["t"] > killed_at]
    before = [e for e in log if killed_at is not None and e["t"] <= killed_at]
    saved = [e for e in before if e["event"] == "saved"]
    done = [e for e in before if e["event"] == "step"]
    last_save = saved[-1] if saved else None
    loads = [e for e in log if e["event"] == "loaded" and after and e["t"] > after[0]["t"]]
    try:
        report = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        report = None
    return Drill(
        returncode=job.returncode,
        killed_at_step=done[-1]["step"] if done else 0,
        detect_seconds=_detected(err, killed_at) - killed_at if killed_at else float("nan"),
        restart_seconds=(after[0]["t"] - killed_at) if after else float("nan"),
        reload_seconds=loads[0]["seconds"] if loads else float("nan"),
        steps_lost=(done[-1]["step"] - (last_save["step"] if last_save else 0)) if done else 0,
        seconds_lost=(killed_at - last_save["t"]) if (last_save and killed_at) else float("nan"),
        attempts=len(starts),
        report=report,
        stderr=err,
    )
