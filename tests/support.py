"""Helpers shared by tests in several rooms: a real ``qkm serve`` process, the command line in-process, npy bodies."""

import io
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from qkm.cli import main


QKM = [sys.executable, "-m", "qkm.cli"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``qkm serve ...`` in a subprocess, its output in a log file."""

    def __init__(self, args, log_path, env=None, program=QKM, cwd=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen([*program, "serve", *args, "--port", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, cwd=cwd,
                                     start_new_session=True)  # its own process group: close() ends the workers too

    def output(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"qkm serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail(f"qkm serve not ready after {timeout} s:\n{self.output()}")

    def stop(self, sig):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.close()

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the uvicorn parent and its workers, never orphans
            self.proc.wait()
        self.log.close()


def run_cli(argv, cwd, monkeypatch, capsys):
    """``qkm ARGV`` in this process from ``cwd``: (exit status, what it wrote on stderr)."""
    monkeypatch.chdir(cwd)
    status = main(argv)
    return status, capsys.readouterr().err


def npy_bytes(arr, **kwargs):
    """``arr`` as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.save(buf, arr, **kwargs)
    return buf.getvalue()
