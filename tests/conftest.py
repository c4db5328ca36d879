"""Shared fixtures: one persistent set of real ranks per world size for the whole test session,
so that the parity suites of every chapter pay the start-up cost once; and the two tiers.

``tests/`` mirrors the package. Every test under a folder that runs strategies, serving or chapters
(``RANK_FOLDERS``), and every test elsewhere that asks for a set of ranks, carries the ``ranks``
marker; ``pytest -m "not ranks"`` is then the fast tier (theory, model, figures, CLI checks, docs),
seconds on a laptop. A test outside that tier which starts ranks another way fails at once, naming
the marker it needs, so the fast tier stays fast."""

import os
import uuid
from pathlib import Path

import cloudpickle
import pytest
import torch

from playbook.book.executed import SESSION
from playbook.cluster import Ranks

# A chapter executed by JupyterLab's Run All in this session (tests/browser) is reused by the book's
# tests (tests/book/test_book.py), never a copy an earlier session left with other code (playbook/book/executed.py).
os.environ[SESSION] = uuid.uuid4().hex

# What the tests compute in their own process (references, single-process runs) uses one thread, like
# each rank: on a 2-core machine that ranks, a kernel or a browser also keep busy, several threads
# run the same small sums 3-30x slower (gpt-tiny's train() + a float64 train_cp(): 1.1-5 s with
# 2 threads, 0.2-0.4 s with 1, at load 16). Tests that need more threads set them and restore this.
torch.set_num_threads(1)


TESTS = Path(__file__).resolve().parent
RANK_FOLDERS = ("book", "browser", "cluster", "exercises", "parallel", "serve")
RANK_FIXTURES = {"ranks2", "ranks4", "ranks8", "ranks16", "rank_sets"}


def pytest_collection_modifyitems(items):
    """The ``ranks`` marker by folder and by fixture (the module docstring). And: a function a test
    module sends to ranks travels by value, as a notebook's does: by reference, each rank of a set
    would import the test module, and with it the CLI and plotly, once per module (about 3 s of CPU
    per rank on a 2-core machine, before the first call of every module)."""
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if folder in RANK_FOLDERS or RANK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ranks)
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        cloudpickle.register_pickle_by_value(module)


_START = Ranks.start


def _refuse_to_start(nodeid: str):
    def refuse(self):
        raise RuntimeError(
            f"{nodeid} starts rank processes: move it under tests/{{{','.join(RANK_FOLDERS)}}}/ "
            "or mark it @pytest.mark.ranks, so that pytest -m 'not ranks' stays the fast tier"
        )

    return refuse


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Outside the ``ranks`` tier, starting ranks is an error that says which marker to add: from the
    setup of the test's fixtures (module- and session-scoped ones too) to the end of its teardown."""
    if item.get_closest_marker("ranks") is None:
        Ranks.start = _refuse_to_start(item.nodeid)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    Ranks.start = _START


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def pids_marked(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (a test's own CLI, forkserver and ranks)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read() and pid_alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture(scope="session")
def rank_sets():
    started: dict[int, Ranks] = {}
    yield started
    for r in started.values():
        r.stop()


@pytest.fixture
def ranks2(rank_sets) -> Ranks:
    return rank_sets.setdefault(2, Ranks(2, backend="gloo", timeout=60)).start()


@pytest.fixture
def ranks4(rank_sets) -> Ranks:
    return rank_sets.setdefault(4, Ranks(4, backend="gloo", timeout=60)).start()


@pytest.fixture
def ranks8(rank_sets) -> Ranks:
    return rank_sets.setdefault(8, Ranks(8, backend="gloo", timeout=60)).start()


@pytest.fixture
def ranks16(rank_sets) -> Ranks:
    """The four-axis layout dp2×tp2×pp2×cp2 (tests/parallel/hybrid/test_hybrid16.py): 16 processes: 3.4 s to start at load 0.2, 15-22 s at load 9-15 (benchmarks/bench_hybrid16.py)."""
    return rank_sets.setdefault(16, Ranks(16, backend="gloo", timeout=60)).start()
