"""Starting the package's programs (found on PATH, as the wheel installs them)
for the tests, on free loopback ports, and stopping them by pid."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

LOOPBACK = "127.0.0.1"

# The benchmarks' process helpers own the port choice (below the ephemeral range).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from mcproc import free_port  # noqa: E402


def program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH: install the wheel first (pip install .)")
    return path


def port_open(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Proc:
    """A child process whose output is collected in the background."""

    def __init__(self, argv: list[str], env: dict | None = None, stdin=subprocess.DEVNULL):
        self.argv = argv
        self.p = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            text=True,
            bufsize=1,
        )
        self.lines: deque[str] = deque(maxlen=2000)
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.p.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    @property
    def pid(self) -> int:
        return self.p.pid

    def output(self) -> str:
        with self._cv:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 30.0) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cv:
            while True:
                lines = list(self.lines)
                for line in lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(lines)
                if self.p.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(f"{self.argv[0]} exited ({self.p.returncode}) before {pattern!r}:\n{self.output()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.argv[0]} did not print {pattern!r} in {timeout}s:\n{self.output()}")
                self._cv.wait(min(left, 0.5))

    def wait_port(self, port: int, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while not port_open(port):
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited ({self.p.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.argv[0]} did not open port {port}:\n{self.output()}")
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signals the process (by pid) and waits; kills it if it hangs."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        return self.p.returncode


def start(name: str, *args: str, env: dict | None = None, stdin=subprocess.DEVNULL) -> Proc:
    return Proc([program(name), *args], env=env, stdin=stdin)


def python(script: str, *args: str, env: dict | None = None) -> Proc:
    """Runs a helper script of this directory with this interpreter."""
    here = os.path.dirname(os.path.abspath(__file__))
    return Proc([sys.executable, "-u", os.path.join(here, script), *args], env=env, stdin=subprocess.PIPE)


class JsonPeer:
    """A helper script speaking one JSON object per line on stdin/stdout."""

    def __init__(self, proc: Proc):
        self.proc = proc
        self._next = 0

    def recv(self, timeout: float = 60.0) -> dict:
        import json

        deadline = time.monotonic() + timeout
        with self.proc._cv:
            while True:
                lines = list(self.proc.lines)
                while self._next < len(lines):
                    line = lines[self._next]
                    self._next += 1
                    if line.startswith("{"):
                        return json.loads(line)
                if self.proc.p.poll() is not None and not self.proc._reader.is_alive():
                    raise RuntimeError(f"peer exited ({self.proc.p.returncode}):\n{self.proc.output()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"peer did not answer in {timeout}s:\n{self.proc.output()}")
                self.proc._cv.wait(min(left, 0.5))

    def call(self, **cmd) -> dict:
        import json

        self.proc.p.stdin.write(json.dumps(cmd) + "\n")
        self.proc.p.stdin.flush()
        return self.recv()

    def close(self):
        try:
            self.proc.p.stdin.write('{"op": "exit"}\n')
            self.proc.p.stdin.flush()
            self.proc.p.wait(15)
        except Exception:
            pass
        return self.proc.stop()
