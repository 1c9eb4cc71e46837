"""The leases on the lines a node holds: renewed while it runs them, handed back at a clean
stop.

A claim (claims.py) stamps each line with the node that took it (`Request.claimed_by`) and
a lease (`Request.lease_until`). The node renews the leases of all its running lines every
third of a lease; a node that dies stops renewing, and once the lease runs out the line is
claimed again by the query that claims a fresh one.
"""

from __future__ import annotations

import time

from sqlalchemy import Update, update
from sqlmodel import col

from app.db import Database
from app.tables import Request, RequestStatus


class Leases:
    """The leases of the lines `worker_id` claimed and is running."""

    def __init__(self, db: Database, worker_id: str, lease_seconds: float) -> None:
        self.db = db
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._last_renew = 0.0

    def renew(self) -> None:
        """Push the leases of this node's running lines a lease ahead, at most every third
        of a lease (the caller calls it on every step while it holds lines)."""
        t = time.time()
        if t - self._last_renew < self.lease_seconds / 3:
            return
        self._last_renew = t
        with self.db.write() as s:
            s.exec(self.own_running().values(lease_until=t + self.lease_seconds))

    def release(self) -> None:
        """Hand this node's running lines back to the queue at once, their attempt not
        counted, instead of making other nodes wait for the lease (a clean stop)."""
        with self.db.write() as s:
            s.exec(
                self.own_running().values(
                    status=RequestStatus.PENDING,
                    lease_until=None,
                    attempts=Request.attempts - 1,
                )
            )

    def own_running(self) -> Update:
        """An UPDATE of the lines this node has claimed and is running."""
        return update(Request).where(
            col(Request.claimed_by) == self.worker_id,
            col(Request.status) == RequestStatus.RUNNING,
        )
