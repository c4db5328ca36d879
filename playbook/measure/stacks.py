"""Where a rank's Python is stuck: its stack, dumped by the interpreter itself while it waits.

A hang's first question is where each rank waits. ``faulthandler`` (Python's standard library) can
dump every thread's stack from a C watchdog thread, which runs even while the main thread blocks
inside a collective's C++ code: ``faulthandler.dump_traceback_later(seconds)`` dumps once a timer
runs out, ``faulthandler.register(signal.SIGUSR1)`` whenever the process gets the signal (``kill
-USR1 <pid>``). From outside, with no code in the job, ``py-spy dump --pid <pid>`` reads the same
stacks (it needs permission to trace the process). :func:`dump_after` takes the first route and
:func:`main_frames` reads the main thread's frames back from the dump's text.
"""

from __future__ import annotations

import faulthandler
import re
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)


@dataclass
class StackDump:
    """A dump's text and, once the ``with`` block has ended, the main thread's frames, innermost first."""

    text: str = ""
    frames: list[tuple[str, int, str]] = field(default_factory=list)  # (file, line, function)


@contextmanager
def dump_after(seconds: float):
    """Dump every thread's stack if the block is still running after ``seconds`` (once)."""
    dump = StackDump()
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback_later(seconds, file=f)
        try:
            yield dump
        finally:
            faulthandler.cancel_dump_traceback_later()
            f.seek(0)
            dump.text = f.read()
            dump.frames = main_frames(dump.text)


def main_frames(text: str, ident: int | None = None) -> list[tuple[str, int, str]]:
    """The frames of thread ``ident`` (default: this process's main thread) in a faulthandler dump,
    innermost first; empty when the dump has none (the block ended before the timer)."""
    ident = threading.main_thread().ident if ident is None else ident
    blocks = _THREAD.split(text)[1:]  # [ident, body, ident, body, ...]
    for tid, body in zip(blocks[::2], blocks[1::2]):
        if int(tid, 16) == ident:
            return [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(body)]
    return []
