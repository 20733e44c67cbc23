"""A progress bar over workloads with a line saying what runs now: tqdm when installed, else a
plain one on stderr (and silent when stderr is not a terminal, so logs stay readable)."""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar: Any = None
        self._last = 0.0
        # tqdm redraws with carriage returns: only on a terminal; a log gets plain lines.
        if not enabled or not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, unit="workload", file=sys.stderr, dynamic_ncols=True,
                         leave=True)

    def say(self, msg: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(msg[:60], refresh=True)
            return
        now = time.monotonic()
        if now - self._last > (0.2 if sys.stderr.isatty() else 5.0):
            self._last = now
            self._plain(msg)

    def step(self, _name: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self.enabled:
            self._plain(_name)

    def _plain(self, msg: str) -> None:
        width = 24
        filled = width * self.done // max(self.total, 1)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {msg[:60]}"
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line.ljust(100))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and sys.stderr.isatty():
            sys.stderr.write("\n")
