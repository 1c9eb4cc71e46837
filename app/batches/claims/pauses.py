"""Lane pauses: a lane whose engine was found down, or whose lines' input store was away,
claims nothing here until its engine says it is up again and LANE_PAUSE_MIN has passed."""

from __future__ import annotations

import dataclasses
import logging
import time

from app.engine.node import Lane

log = logging.getLogger("batchyard.runner")

#: Seconds a lane stays paused after its engine was found down, even if the engine says it
#: is up again sooner (an engine that does not track its own state is not hammered).
LANE_PAUSE_MIN = 1.0


class LanePauses:
    """The lanes paused on this node, each with when (monotonic). The runner's thread
    alone reads and writes them."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def pause(self, lane: str) -> bool:
        """Pause `lane` from now on; True if it was not paused already."""
        fresh = lane not in self._since
        self._since[lane] = time.monotonic()
        return fresh

    def open(self, lanes: list[Lane]) -> list[Lane]:
        """`lanes`, those paused here marked down; a paused lane opens again once its
        engine says it is up and LANE_PAUSE_MIN has passed."""
        now = time.monotonic()
        out = []
        for lane in lanes:
            since = self._since.get(lane.name)
            if since is not None:
                if lane.up and now - since >= LANE_PAUSE_MIN:
                    del self._since[lane.name]
                    log.info("lane=%s engine is up again: claiming", lane.name)
                else:
                    lane = dataclasses.replace(lane, up=False)
            out.append(lane)
        return out
