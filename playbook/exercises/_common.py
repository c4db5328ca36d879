"""What every checker shares: the verdict, running a learner's function on real ranks with its
collectives traced, and turning a rank's failure or a hang into one sentence a learner can act on.

A checker never shows a wall of torch internals: a rank that raised is reported as the exception's
last line and the learner's own line of code; a hang as what each rank was waiting in.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

import numpy as np

from playbook import cluster
from playbook.cluster import RankError, RankTimeout

HANG_SECONDS = 6.0  # a check answers within 10 s, a hang included (the budget)
_TORCH_FRAMES = re.compile(r"/(torch|playbook|multiprocessing|cloudpickle)/")


class LearnerError(RuntimeError):
    """The learner's function raised on a rank: the exception in one line, and where in the
    learner's code (``[at name line N]``: the parent, which has the notebook cell's source, shows it)."""


class NotYetWritten(NotImplementedError):
    """Raised by an exercise's blank: the check reports "not yet written" instead of failing."""

    def __init__(self, what: str = "this exercise"):
        super().__init__(f"{what} is not yet written — fill in the cell above, then run the check again")


@dataclass
class Verdict:
    """A checker's answer: ``ok``, one message in the learner's terms, and the measured numbers."""

    exercise: str
    ok: bool
    message: str
    numbers: dict = field(default_factory=dict)

    def __str__(self) -> str:
        mark = "✓ correct" if self.ok else "✗ not yet"
        lines = [f"{self.exercise}: {mark}", self.message]
        lines += [f"  {k}: {_fmt(v)}" for k, v in self.numbers.items()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def __bool__(self) -> bool:
        return self.ok


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{int(v):,}" if v.is_integer() and abs(v) >= 1 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def shared_ranks(ranks=None):
    """The ranks to check on: the ones given, else the notebook's running set if it has 2-4 ranks
    (so a check does not restart it), else ``playbook.cluster.ranks(2)``."""
    if ranks is not None:
        return ranks
    current = cluster.running_ranks()
    n = current.world_size if current is not None and 2 <= current.world_size <= 4 else 2
    return cluster.ranks(n)


def learner_line(remote_traceback: str) -> str:
    """The last frame of the traceback that is the learner's code (not torch's, not ours)."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n(?:    (.*)\n)?', remote_traceback)
    mine = [f for f in frames if not _TORCH_FRAMES.search(f[0])]
    if not mine:
        return ""
    _, line, func, code = mine[-1]
    return f" in {func}, line {line}: `{code.strip()}`" if code else f" in {func}, line {line}"


def _resolve(last: str, learners) -> str:
    """``RuntimeError: ... [at tp_mlp line 3]`` -> ``RuntimeError: ... in tp_mlp, line 3: `code```."""
    m = re.search(r" \[at (\S+) line (\d+)\]$", last)
    if not m:
        return last
    text = last[: m.start()]
    for fn in learners:
        code = getattr(fn, "__code__", None)
        if code is not None and fn.__name__ == m[1]:
            line = linecache.getline(code.co_filename, int(m[2])).strip()
            return f"{text} in {m[1]}, line {m[2]}" + (f": `{line}`" if line else "")
    return f"{text} in {m[1]}, line {m[2]}"


def failure_message(err: BaseException, n: int, learners=()) -> str:
    """One sentence for a rank that raised or a set of ranks that hung."""
    if isinstance(err, RankTimeout):
        return hang_message(err.waiting, n)
    if isinstance(err, RankError):
        text = err.remote_traceback.strip()
        last = text.splitlines()[-1] if text else (err.headline or str(err).splitlines()[0])
        if "NotYetWritten" in last:
            return "not yet written — fill in the cell above, then run the check again"
        if "LearnerError: " in last:
            return f"rank {err.rank} raised {_resolve(last.split('LearnerError: ', 1)[1], learners)}"
        last = re.sub(r"^[\w.]+\.(\w+Error|\w+Exception)", r"\1", last)  # torch.OutOfMemoryError -> OutOfMemoryError
        return f"rank {err.rank} raised {last}{learner_line(text)}"
    return f"{type(err).__name__}: {err}"


def hang_message(waiting: dict[int, str], n: int) -> str:
    """``rank 1 waits in all_reduce (64 B, group world) for 6.0 s; rank 0 already returned``."""
    parts = []
    for r, status in sorted(waiting.items()):
        m = re.match(r"waiting in (\S+) \((.*)\) \(for ([\d.]+) s\)", status)
        if m:
            parts.append(f"rank {r} waits in {m[1]} ({m[2]}) for {m[3]} s")
        else:
            parts.append(f"rank {r} is still running your code, not in a collective")
    done = [r for r in range(n) if r not in waiting]
    if done:
        parts.append(f"rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} already returned")
    return (
        "hang: "
        + "; ".join(parts)
        + " — every rank must issue the same collectives, in the same order, with the same sizes"
    )


_BLANK = "__not_yet_written__"


def _guarded(ctx, rank_fn, *args):
    """A blank exercise raises on every rank before any collective: answer instead of failing, so
    that the ranks stay up (a rank that raises makes the whole set restart on the next call)."""
    try:
        return rank_fn(ctx, *args)
    except NotYetWritten:
        return _BLANK


def run_checked(ranks, rank_fn, *args, timeout: float = HANG_SECONDS) -> tuple[list | None, str]:
    """``ranks.run(rank_fn, *args)`` with a short timeout; (results, "") or (None, the failure)."""
    try:
        results = ranks.run(_guarded, rank_fn, *args, timeout=timeout, progress=False)
    except (RankError, RankTimeout) as err:
        return None, failure_message(err, ranks.world_size, [a for a in args if callable(a)])
    if any(isinstance(r, str) and r == _BLANK for r in results):
        return None, "not yet written — fill in the cell above, then run the check again"
    return results, ""


def traced_call(ctx, fn, *args):
    """Inside a rank: ``fn(*args)`` with its collectives recorded apart from the checker's own;
    returns (result, [(op, buffer bytes, sent bytes, group size)] in call order)."""
    from playbook.cluster.trace.tracer import Tracer, recording

    tracer = Tracer(ctx.rank, on_status=ctx.tracer.on_status)  # a hang is still named
    with recording(tracer):
        try:
            result = fn(*args)
        except NotYetWritten:
            raise
        except Exception as e:  # the learner's error: its one line, and the learner's line of code
            where, tb = "", e.__traceback__
            while tb is not None:
                if tb.tb_frame.f_globals is getattr(fn, "__globals__", None):
                    where = f" [at {tb.tb_frame.f_code.co_name} line {tb.tb_lineno}]"
                tb = tb.tb_next
            raise LearnerError(f"{type(e).__name__}: {e}{where}") from None
    calls = [(s.name, s.bytes, s.sent_bytes, s.group_size) for s in tracer.comm()]
    return result, calls


def collective_diff(calls: list, predicted: list[tuple[str, int]], family) -> str:
    """'' if ``calls`` match ``predicted`` [(op family, buffer bytes)], else one sentence per op that
    differs: how many times it was called and with which buffer sizes, against the prediction."""
    ops = sorted({family(c[0]) for c in calls} | {op for op, _ in predicted})
    out = []
    for op in ops:
        got = sorted(b for o, b, *_ in calls if family(o) == op)
        want = sorted(b for o, b in predicted if o == op)
        if got == want:
            continue
        sizes = lambda xs: ", ".join(f"{b} B" for b in xs)  # noqa: E731
        if len(got) != len(want):
            out.append(
                f"you called {op} {len(got)}× ({sizes(got) or 'never'}); predicted {len(want)}× ({sizes(want) or 'none'})"
            )
        else:
            out.append(f"your {op} calls move {sizes(got)}; predicted {sizes(want)}")
    return "; ".join(out)


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)), initial=0.0))


def close(a, b, tol: float = 1e-5) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol * (1 + np.abs(b))))
