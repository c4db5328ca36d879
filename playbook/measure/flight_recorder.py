"""PyTorch's flight recorder, read on real ranks: the last collectives each rank's process groups
issued, and the first one the ranks disagree on.

The flight recorder (``torch.distributed``, C++ ``FlightRecorder``) keeps a ring buffer of every
collective a process group issues: the group, the collective's sequence number in that group, its
name (``gloo:all_reduce``, ``nccl:all_reduce``), input and output sizes and dtypes, its state and the
Python stack that issued it. It is off until ``TORCH_FR_BUFFER_SIZE`` (formerly
``TORCH_NCCL_TRACE_BUFFER_SIZE``) names how many entries to keep; the variable is read when the
recorder is first used, so set it (:func:`enable`) before the collectives to record. In PyTorch 2.13
it records gloo's collectives as well as NCCL's (measured here: ``tests/measure/test_flight_recorder.py``);
what is NCCL's alone is the *automatic* dump when NCCL's watchdog times out
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, one file per rank named by ``TORCH_FR_DUMP_TEMP_FILE``).
``torch._C._distributed_c10d._dump_fr_trace()`` dumps it on demand, as a pickle.

The analyzer that ships with torch (``torchfrtrace``, ``torch.distributed.flight_recorder.fr_trace``)
matches the ranks' dumps by group and sequence number. On 2.13 it stops with a ``KeyError`` on gloo
dumps, which carry no membership for their groups (``pg_config`` is empty for them);
:func:`first_mismatch` does its central step, the match, from the entries alone.
"""

from __future__ import annotations

import os
import pickle


def enable(entries: int = 2000) -> None:
    """Keep the last ``entries`` collectives of every process group created from now on (this rank)."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(entries)


def recorded() -> list[dict]:
    """This rank's flight-recorder entries, oldest first: {group, seq, op, input_sizes, state}."""
    from torch._C._distributed_c10d import _dump_fr_trace

    dump = pickle.loads(_dump_fr_trace())
    return [
        {
            "group": e["process_group"][0],
            "seq": e["collective_seq_id"],
            "op": e["profiling_name"],
            "input_sizes": e["input_sizes"],
            "state": e["state"],
        }
        for e in dump.get("entries", [])
    ]


def first_mismatch(per_rank: list[list[dict]], group: str | None = None) -> str | None:
    """The first collective (by sequence number, within a group) that not every rank of ``per_rank``
    entered with the same op and input sizes, said in one line; None when they all agree."""
    groups = sorted({e["group"] for entries in per_rank for e in entries} if group is None else {group})
    for g in groups:
        seqs = [{e["seq"]: e for e in entries if e["group"] == g} for entries in per_rank]
        for seq in sorted(set().union(*seqs)):
            seen = [s.get(seq) for s in seqs]
            kinds = {(e["op"], str(e["input_sizes"])) if e else None for e in seen}
            if len(kinds) > 1:
                said = ", ".join(
                    f"rank {r} in {e['op']} of {e['input_sizes']}" if e else f"rank {r} never got there"
                    for r, e in enumerate(seen)
                )
                return f"group {g}, collective #{seq}: {said}"
    return None
