"""Where the time of a fit over shards goes: phases on the driver and in the shard tasks (private, diagnostics).

A phase is one event ``(process id, shard, name, start, end)`` with wall-clock
seconds (``time.time()``, comparable between the processes of one machine).
The shard tasks return theirs with their partial results (the combine adds
its own); the driver keeps its own and those of every iteration in
:attr:`ShardedData.rounds <qkm.distributed.ShardedData>`. Nothing here
changes a result (``benchmarks/distributed_phases.py`` reads the events).
"""

import contextlib
import os
import threading
import time

__all__ = ["Timeline", "task_timeline", "nested_phase"]

_LOCAL = threading.local()  # the timeline of the shard task running in this thread


class Timeline:
    """Events of one process; ``phase(name)`` records the wall-clock time of a ``with`` block."""

    MAX_EVENTS = 100_000  # older events are dropped past this (rounds nobody took)

    def __init__(self, enabled=True):
        self.enabled = enabled
        self.events = []

    def _trim(self):
        if len(self.events) > self.MAX_EVENTS:
            del self.events[:len(self.events) - self.MAX_EVENTS // 2]

    @contextlib.contextmanager
    def phase(self, name, shard=-1):
        if not self.enabled:
            yield
            return
        t0 = time.time()
        try:
            yield
        finally:
            self.events.append((os.getpid(), int(shard), name, t0, time.time()))
            self._trim()

    def add(self, events):
        if self.enabled:
            self.events.extend(events)
            self._trim()

    def take(self):
        out, self.events = self.events, []
        return out


@contextlib.contextmanager
def task_timeline():
    """A :class:`Timeline` for one shard task; :func:`nested_phase` inside it (e.g. in an operator) records there."""
    tl = Timeline()
    previous, _LOCAL.timeline = getattr(_LOCAL, "timeline", None), tl
    try:
        yield tl
    finally:
        _LOCAL.timeline = previous


@contextlib.contextmanager
def nested_phase(name):
    """A phase inside another one of the current task (named ``outer/inner``: not counted twice as busy)."""
    tl = getattr(_LOCAL, "timeline", None)
    if tl is None:
        yield
        return
    with tl.phase(name):
        yield

