"""One polling thread: run a step, wait until woken, stopped or the interval passes, repeat.

The runner and the webhooks' sender both work this way. They used to carry a loop each,
and the two had drifted: after a failed step the runner slept a whole second with
`time.sleep` and did not hear `stop()` until it woke, while the webhooks waited on their
stop event. Here there is one loop, and the back-off after a failed step waits on the stop
event, so a stop is heard at once whatever the thread is doing between two steps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

#: Seconds a polling thread waits after a step that raised, before it tries again (unless
#: stopped): a failing database is not hammered, and a stop is still heard at once.
BACKOFF = 1.0


class PollingThread:
    """A daemon thread that calls `step()`, then waits `interval` seconds or until `wake()`
    or `stop()`, and calls it again, until stopped.

    A step that raises is logged and followed by a back-off of `backoff` seconds that only
    `stop()` ends (a wake does not: a step that fails for every result that comes back
    would otherwise spin). `on_exit` runs on the thread after its last step, once stopped.
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        interval: float,
        *,
        log: logging.Logger,
        backoff: float = BACKOFF,
        on_exit: Callable[[], object] | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self.backoff = backoff
        self._step = step
        self._log = log
        self._on_exit = on_exit
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """True once stop() was called: a long step may end early."""
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next step now instead of at the end of the interval."""
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """Ask the thread to end after its current step and wait up to `timeout` for it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Cleared before the step, so a wake() during the step is not lost: the
                # wait below returns at once and the next step runs.
                self._wake.clear()
                try:
                    self._step()
                except Exception:
                    self._log.exception(
                        "%s: step failed; retrying in %.1f s", self.name, self.backoff
                    )
                    self._stop.wait(self.backoff)
                    continue
                self._wake.wait(timeout=self.interval)
        finally:
            if self._on_exit is not None:
                self._on_exit()
