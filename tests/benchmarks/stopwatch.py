"""`with Stopwatch() as s: …` then `s.seconds` (and `s.started`, on perf_counter's clock)."""

from __future__ import annotations

import time


class Stopwatch:
    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started
