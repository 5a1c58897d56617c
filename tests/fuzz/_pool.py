"""One persistent worker process that runs fuzz cases, so a crash, an abort or a hang is a
finding rather than the end of the test run.

Importing jax costs seconds, a case milliseconds: the worker imports jax and jax_gpuext once and
then runs cases sent over a pipe (length-prefixed pickles) until it dies. When a case kills it
(signal, abort, sanitizer report) or runs past its timeout, the outcome says so, with the tail of
the worker's stderr, and the next case starts a fresh worker. One worker, not a pool: CI has two
cores and the test process itself only waits.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time

WORKER = pathlib.Path(__file__).with_name("_worker.py")
HEADER = struct.Struct("<Q")


@dataclasses.dataclass
class Outcome:
    """``status``: "ok" (``value`` holds what the case returned), "raised" (``exc_type`` and
    ``message``), "crashed" (the worker died: ``message`` has its exit status and stderr tail)
    or "hung" (no answer within the timeout; the worker was killed)."""

    status: str
    value: object = None
    exc_type: str = ""
    message: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        if self.status == "raised":
            return f"raised {self.exc_type}: {self.message}"
        return f"{self.status}: {self.message}" if self.message else self.status


def _write_all(fd, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n: int, deadline: float) -> bytes | None:
    """n bytes from fd, or None at EOF or once the deadline passes."""
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class Worker:
    """The fuzz worker; ``run(kind, case)`` executes ``_worker.KINDS[kind](**case)`` in it."""

    def __init__(self, env: dict | None = None):
        self._env = {**os.environ, **(env or {})}
        self._proc = None
        self.starts = 0

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-u", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, env=self._env, start_new_session=True)
        self.starts += 1

    def _stderr_tail(self, limit: int = 6000) -> str:
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - limit))
        return self._stderr.read().decode(errors="replace")

    def _kill(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def run(self, kind: str, case: dict, timeout: float = 120.0) -> Outcome:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        start = time.monotonic()
        try:
            blob = pickle.dumps((kind, case), protocol=pickle.HIGHEST_PROTOCOL)
            _write_all(self._proc.stdin.fileno(), HEADER.pack(len(blob)) + blob)
        except BrokenPipeError:
            pass  # reported below as a crash, with the exit status
        deadline = start + timeout
        fd = self._proc.stdout.fileno()
        header = _read_exact(fd, HEADER.size, deadline)
        body = None if header is None else _read_exact(fd, HEADER.unpack(header)[0], deadline)
        seconds = time.monotonic() - start
        if body is not None:
            status, *rest = pickle.loads(body)
            if status == "ok":
                return Outcome("ok", value=rest[0], seconds=seconds)
            return Outcome("raised", exc_type=rest[0], message=rest[1], seconds=seconds)
        if self._proc.poll() is None and time.monotonic() >= deadline:
            self._kill()
            return Outcome("hung", message=f"no answer within {timeout:.0f} s; stderr tail:\n{self._stderr_tail()}",
                           seconds=seconds)
        code = self._proc.wait()
        why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self._proc = None
        return Outcome("crashed", message=f"worker died ({why}); stderr tail:\n{self._stderr_tail()}", seconds=seconds)

    def close(self) -> None:
        self._kill()
