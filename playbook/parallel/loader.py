"""A real input pipeline on each rank: ``torch.utils.data.DataLoader`` with worker processes and
prefetch, serving this rank's batch of each step, and its position to save and restore.

Each step's batch is an item of a map-style dataset (:class:`StepBatches`): item ``k`` is this
rank's ``(tokens, targets)`` of step ``k``, made by the same function the loop would call inline
(``SyntheticTask.batch`` on CPU), so training with the loader sees exactly the batches it sees
without it (the parity the tests hold). ``delay_s`` stands for the work a real loader does per
batch (reading, decoding, tokenizing, packing): a ``time.sleep`` in ``__getitem__``, so in a worker
it costs no CPU of the rank's. With ``workers`` processes, each keeping ``prefetch`` batches ahead
(PyTorch's ``num_workers`` and ``prefetch_factor``; *torch.utils.data* documentation), a batch is
ready when the step asks for it if ``workers / delay_s`` batches per second outrun the step; if not,
the rank waits, and that wait is recorded on the measured timeline as a compute-row span named
:data:`INPUT_WAIT` ("input wait"), outside the step's own span (``parallel.training.train`` asks for
the batch before it opens ``step N``). With ``workers=0`` the batch is made in the rank itself,
every ``delay_s`` of it waited.

**Its position, for checkpoints.** ``RankLoader.state_dict()`` is ``{"next_step": k, "workers":
..., "prefetch": ...}``: the step whose batch comes next. ``load_state_dict(state)`` sets it; the
next batch asked for is step k's, and a request for any other step repositions the iterator
there (a fresh pass of the sampler from that step: the in-flight prefetched batches are dropped).
A checkpoint saves ``state_dict()`` beside the model and optimizer; a resumed run calls
``load_state_dict`` before its first step (its workers start prefetching from step k at once;
``repositions`` counts the requests that found another step in flight), and sees the same batches from step k on as the
uninterrupted run, whatever the worker count (the batches depend on the step, not on the
worker that made them).
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from playbook.measure.steps import INPUT_WAIT  # the span's name, which measure.steps reads back


class StepBatches(Dataset):
    """Item ``k``: ``make(k)``, this rank's batch of step ``k``, after ``delay_s`` of stand-in work."""

    def __init__(self, make: Callable[[int], tuple[torch.Tensor, torch.Tensor]], steps: int, delay_s: float = 0.0):
        self.make, self.steps, self.delay_s = make, steps, delay_s

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        if self.delay_s:
            time.sleep(self.delay_s)  # reading, decoding, tokenizing: what a real loader spends per batch
        return self.make(step)


class _FromStep(Sampler):
    """Steps ``start, start + 1, …, steps − 1``, in order."""

    def __init__(self, start: int, steps: int):
        self.start, self.steps = start, steps

    def __iter__(self):
        return iter(range(self.start, self.steps))

    def __len__(self) -> int:
        return max(0, self.steps - self.start)


class RankLoader:
    """``loader(step) -> (tokens, targets)``: the batch of ``step`` from a DataLoader over
    :class:`StepBatches`, timed as an "input wait" span on ``tracer`` (see the module docstring)."""

    def __init__(
        self,
        make: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        steps: int,
        *,
        workers: int = 0,
        prefetch: int | None = None,
        delay_s: float = 0.0,
        tracer=None,
    ):
        check_loader(workers, prefetch, delay_s)
        self.dataset = StepBatches(make, steps, delay_s)
        self.workers, self.prefetch, self.tracer = workers, prefetch, tracer
        self._next, self._it = 0, None
        self.repositions = 0  # requests for a step other than the one prefetched: batches in flight dropped

    def _open(self, start: int) -> None:
        self.close()
        # fork: a worker starts in milliseconds with the rank's modules and the dataset's closure (the
        # ranks' own default, forkserver, would start a new server that imports torch, and pickle
        # the dataset); workers make CPU tensors only, so a rank's CUDA context is never used there
        extra = {"prefetch_factor": self.prefetch or 2, "multiprocessing_context": "fork"} if self.workers else {}
        with warnings.catch_warnings():  # more workers than cores is the point here: they sleep, not compute
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            loader = DataLoader(
                self.dataset,
                batch_size=None,  # each item already is a batch
                sampler=_FromStep(start, len(self.dataset)),
                num_workers=self.workers,
                **extra,
            )
            self._it, self._next = _started(loader), start

    def __call__(self, step: int):
        if self._it is None or step != self._next:
            self.repositions += self._it is not None
            self._open(step)
        span = self.tracer.span(INPUT_WAIT) if self.tracer is not None else None
        if span is None:
            batch = next(self._it)
        else:
            with span:
                batch = next(self._it)
        self._next = step + 1
        return batch

    def state_dict(self) -> dict:
        return {"next_step": self._next, "workers": self.workers, "prefetch": self.prefetch}

    def load_state_dict(self, state: dict) -> None:
        step = state["next_step"]
        if not (isinstance(step, int) and 0 <= step <= len(self.dataset)):
            raise ValueError(f"next_step must be a step in 0..{len(self.dataset)}, got {step!r}")
        self.close()
        self._next = step
        if step < len(self.dataset):  # the workers start now, prefetching from the restored step while the rest loads
            self._open(step)

    def close(self) -> None:
        """Stop the workers (the iterator's shutdown); the position is kept."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def _started(loader: DataLoader):
    """``iter(loader)``, its workers started even from a daemonic process: the ranks are daemons
    (they die with the notebook), and ``multiprocessing`` refuses a daemon children. The flag is
    lifted while the workers start, then restored; each worker is itself a daemon, watches its
    parent (PyTorch's worker loop exits when the rank is gone) and is stopped by ``close()``."""
    import multiprocessing

    config = multiprocessing.current_process()._config
    daemon = config.get("daemon")
    config["daemon"] = False
    try:
        return iter(loader)
    finally:
        if daemon is not None:
            config["daemon"] = daemon
        else:
            config.pop("daemon", None)


def check_loader(workers, prefetch, delay_s) -> None:
    """One line for a loader option that cannot work, naming what would."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= 64:
        raise ValueError(f"--loader-workers must be an integer in 0..64, got {workers!r}; e.g. --loader-workers 2")
    if prefetch is not None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= 64:
            raise ValueError(
                f"--prefetch must be an integer in 1..64 (batches per worker), got {prefetch!r}; e.g. --prefetch 2"
            )
        if workers == 0:
            raise ValueError(
                f"--prefetch {prefetch} is batches kept ahead by each worker, and --loader-workers is 0 (batches made "
                "in the rank itself, none ahead); add --loader-workers 2 or drop --prefetch"
            )
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s <= 60:
        raise ValueError(
            f"--loader-delay-ms must be between 0 and 60000 ms, got {delay_s * 1e3 if isinstance(delay_s, (int, float)) else delay_s!r}; "
            "e.g. --loader-delay-ms 50"
        )
