"""One JupyterLab server for the browser tests: started from this venv in a throw-away home, stopped
with every kernel (and every rank process a kernel started) it ever ran.

Everything the server writes (settings, workspaces, runtime files, the notebook copies it autosaves)
lives in one temporary folder. Each process it starts inherits a marker variable, so that the stop
can find every descendant in /proc, including rank processes in sessions of their own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MARKER = "PLAYBOOK_BROWSER_TEST"
# JupyterLab 4 keeps only the cells on screen in the DOM; a long chapter needs all of them there.
USER_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries ``MARKER=marker``: the server and all it started."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                if (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """``jupyter lab`` on 127.0.0.1 serving copies of ``notebooks`` (so autosave cannot touch the originals)."""

    def __init__(self, notebooks: Path, python: str = sys.executable, start_timeout: float = 60.0):
        self.tmp = Path(tempfile.mkdtemp(prefix="playbook-lab-"))
        self.root = self.tmp / "notebooks"
        shutil.copytree(notebooks, self.root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for nb in self.root.rglob("*.ipynb"):  # saved outputs must not be able to fake a pass
            doc = json.loads(nb.read_text())
            for cell in doc["cells"]:
                if cell["cell_type"] == "code":
                    cell["outputs"], cell["execution_count"] = [], None
            nb.write_text(json.dumps(doc))
        for name, settings in USER_SETTINGS.items():
            path = self.tmp / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(settings))
        self.token, self.port, self.marker = secrets.token_hex(16), _free_port(), secrets.token_hex(8)
        env = {
            **os.environ,
            MARKER: self.marker,
            "HOME": str(self.tmp / "home"),
            "JUPYTER_CONFIG_DIR": str(self.tmp / "config"),
            "JUPYTER_DATA_DIR": str(self.tmp / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.tmp / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(self.tmp / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.tmp / "workspaces"),
            "IPYTHONDIR": str(self.tmp / "ipython"),
        }
        args = [python, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1"]
        args += [f"--ServerApp.root_dir={self.root}", f"--IdentityProvider.token={self.token}"]
        args += ["--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0"]
        if os.geteuid() == 0:
            args.append("--allow-root")
        self.log = open(self.tmp / "server.log", "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(start_timeout)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.url}/api/{path}", method=method)
        req.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer /api/status within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        return (self.tmp / "server.log").read_bytes()[-n:].decode(errors="replace")

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"

    def shutdown_kernels(self) -> None:
        """Shut every running kernel down through the REST API (the kernel stops its ranks itself)."""
        for kernel in self.api("kernels") or []:
            try:
                self.api(f"kernels/{kernel['id']}", method="DELETE")
            except OSError:
                pass

    def stop(self, grace: float = 10.0) -> list[int]:
        """Stop kernels, then the server; kill whatever is left. Returns the pids that had to be killed."""
        if self.proc.poll() is None:
            try:
                self.shutdown_kernels()
                self.api("shutdown", method="POST")
                self.proc.wait(grace)
            except (OSError, subprocess.TimeoutExpired):
                pass
        deadline = time.monotonic() + grace
        while marked_pids(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftover = marked_pids(self.marker)
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.log.close()
        return leftover

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
