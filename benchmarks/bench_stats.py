"""Robust timing for a shared machine: interleaved repetitions, median and min, a busy-machine flag.

Every engine of a row is timed once per repetition, the order rotated between repetitions, so a
burst of load from another process hits all engines alike instead of one engine's whole series.
A row's figure is the *median* over repetitions (one slow repetition cannot decide it) beside the
*min* (the quiet-machine estimate); the relative spread ``(median - min) / min`` flags rows measured
while the machine was busy. Memory is measured apart from the timings: a sampling thread would
perturb them.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

# (median - min) / min above this marks a series as disturbed (another process took a core).
BUSY_SPREAD = 0.25


@dataclass
class Series:
    """Wall and CPU seconds of one engine's repetitions."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """Median wall seconds."""
        return statistics.median(self.wall)

    @property
    def best(self) -> float:
        """Fastest repetition (wall seconds)."""
        return min(self.wall)

    @property
    def spread(self) -> float:
        """(median - min) / min of the wall times: 0 on a quiet machine."""
        return self.median / self.best - 1.0

    @property
    def busy(self) -> bool:
        """True when the spread says some repetitions waited for a core."""
        return len(self.wall) > 1 and self.spread > BUSY_SPREAD

    def to_dict(self) -> dict:
        """Plain-JSON form with the summary statistics."""
        d = asdict(self)
        d.update(median=self.median, min=self.best, spread=self.spread, busy=self.busy)
        return d


def median_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Median wall seconds of ``reps`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def interleaved(fns: dict[str, Callable[[], Any]], reps: int) -> tuple[dict[str, Series], dict[str, Any]]:
    """Time every function ``reps`` times, one of each per repetition, rotating the order."""
    names = list(fns)
    series = {k: Series() for k in names}
    last: dict[str, Any] = {}
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            wall, cpu, last[name] = timed(fns[name])
            series[name].wall.append(wall)
            series[name].cpu.append(cpu)
    return series, last


def load_average() -> float | None:
    """1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_during(fn: Callable[[], Any], interval: float = 0.001) -> tuple[int, int]:
    """(peak RSS above the starting RSS while ``fn`` runs, RSS growth after it) in bytes, by sampling."""
    start = rss_bytes()
    peak = [start]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes())
            stop.wait(interval)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()
    end = rss_bytes()
    return max(peak[0], end) - start, end - start
