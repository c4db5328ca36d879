"""Run: the parent's side of one call: gather each rank's reply, print what ranks print, feed the
progress bar, and turn failures, deaths and hangs into one error that names the cause."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import sys
import time
from typing import Any

from playbook.cluster.errors import _PEER_LOST, RankError, RankTimeout, _how_it_ended, _rank_list, _where
from playbook.cluster.processes import _loads
from playbook.cluster.rank import STATUS_WIDTH, _process_state


class _Replies:
    """What :class:`~playbook.cluster.Ranks` does while a call runs (it holds ``processes``,
    ``_conns``, ``_status`` and ``_since``): one reply per rank, or the error that explains why not."""

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


class _ProgressBar:
    """A tqdm bar (a widget in Jupyter) that follows the slowest rank."""

    def __init__(self, world_size: int):
        self.done = [0] * world_size
        self.bar = None

    def update(self, rank: int, done: int, total: int, desc: str) -> None:
        from tqdm.auto import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=desc or "ranks", leave=False)
        self.done[rank] = done
        self.bar.n = min(self.done)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
