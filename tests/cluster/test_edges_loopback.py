"""Issue 31: local gloo ranks listen on loopback only, even where the hostname resolves to a
routable address (simulated with a private UTS namespace whose hostname is this machine's own
non-loopback address, which getaddrinfo returns as is)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os
from playbook.cluster import Ranks

def listeners(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN, owned by this rank
                    found.append(cols[1].split(":")[0])
    return found

with Ranks(2, backend="gloo", timeout=60) as r:
    assert r.run(lambda ctx: ctx.rank) == [0, 1]
    print(json.dumps({pid: listeners(pid) for pid in r.pids()}))
"""

LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def _routable_address() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
        address = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if address.startswith("127.") else address


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs Linux, root and unshare for a private hostname",
)
def test_every_rank_listens_on_loopback_even_when_the_hostname_is_routable():
    address = _routable_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("GLOO_SOCKET_IFNAME", None)
    script = f'hostname {address} && exec {sys.executable} -c "$PROBE"'
    done = subprocess.run(
        ["unshare", "--uts", "sh", "-c", script],
        env={**env, "PROBE": PROBE},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(found.values()), f"a rank has no listener at all: {found}"
    for pid, addresses in found.items():
        assert set(addresses) <= LOOPBACK, f"rank process {pid} listens on {addresses} (hostname -> {address})"
