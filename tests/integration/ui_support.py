"""What the run view tests share: a real ``toolexec ui`` process, and Debian's Chromium.

:func:`chromium` returns the path of Debian's Chromium, installing the package with
``apt-get`` when the machine has none (the README's test command needs no other step);
several test processes at once install it once, under a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from toolexec.process import ChildProcess, free_port

__all__ = ["CHROMIUM", "UiServer", "chromium", "ui_server"]

#: Where Debian's package puts Chromium.
CHROMIUM = Path("/usr/bin/chromium")
_LOCK = Path(tempfile.gettempdir()) / "toolexec-chromium-install.lock"


def chromium() -> Path:
    """Debian's Chromium, installed first if missing (``apt-get``, as root)."""
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not CHROMIUM.exists():
            _install()
    if not CHROMIUM.exists():
        raise RuntimeError(f"installing Debian's chromium left no {CHROMIUM}")
    return CHROMIUM


def _install() -> None:
    apt = shutil.which("apt-get")
    if apt is None:
        raise RuntimeError(
            "the browser tests need Debian's chromium, and this machine has no apt-get"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = [apt, "install", "-y", "--no-install-recommends", "chromium"]
    if subprocess.run(command, env=env, capture_output=True, check=False).returncode != 0:
        # The package lists may be missing or old on a fresh machine.
        subprocess.run([apt, "update"], env=env, capture_output=True, check=True)
        subprocess.run(command, env=env, capture_output=True, check=True)


class UiServer:
    """A running ``toolexec ui`` on a free port of loopback."""

    def __init__(self, process: ChildProcess, url: str) -> None:
        self.process = process
        self.url = url

    def get(self, path: str, **options: object) -> httpx.Response:
        """``GET`` ``path`` of the server."""
        return httpx.get(self.url + path, timeout=10.0, **options)  # type: ignore[arg-type]


@contextlib.contextmanager
def ui_server(env: Mapping[str, str], log_dir: Path) -> Iterator[UiServer]:
    """Run ``python -m toolexec ui --port P`` with ``env``; stopped by PID at the end."""
    port = free_port()
    process = ChildProcess(
        "toolexec-ui",
        [sys.executable, "-m", "toolexec", "ui", "--port", str(port)],
        env={**os.environ, **env},
        log_dir=log_dir,
    )
    with process:
        server = UiServer(process, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30.0
        while True:
            try:
                if server.get("/api/runs").status_code in (200, 401):
                    break
            except httpx.TransportError:
                pass
            if not process.is_running or time.monotonic() > deadline:
                raise RuntimeError(f"toolexec ui did not start:\n{process.log_tail()}")
            time.sleep(0.05)
        yield server
