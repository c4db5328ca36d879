"""Run: what a failed call raises, and the words for how a rank ended.

A rank that raised gives :class:`RankError` with its traceback (source lines put back for functions
shipped by value); a rank that died gives one naming its exit code or signal and the collective it
was in; a hang gives :class:`RankTimeout` saying what each rank was waiting in.
"""

from __future__ import annotations

import linecache
import re
import signal
from typing import Callable


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


# What a rank's collective raises when the process at the other end is gone (gloo, NCCL, sockets).
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|"
    r"NCCL communicator was aborted|Socket Timeout|ECONNRESET|EPIPE"
)


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
