"""A SeaweedFS restart in the middle of a fast batch: bench/faults.py with its SeaweedFS
fault alone. Two nodes on one PostgreSQL with their files in SeaweedFS (harness/seaweed.py)
feed harness/upstream.py's fixed-latency upstream 20,000 padded lines as one batch; at 13,000
done SeaweedFS is killed, stays away --away-s seconds, and starts again on the same ports
and data. It reports the lines that failed (the bar: 0), ended twice or never, the run
time, and the lines a second before, during and after the restart. Every option of
bench/faults.py applies (`--faults` too).

    python bench/bucket_restart.py
    python bench/bucket_restart.py --lines 5000 --faults seaweed@2000 --json out.json

Figures (2 cores shared with other engineers' runs): before the lines that wait for the
bucket (fa18a8a), 4,643 of 20,000 lines failed with "the object store did not answer";
after it 0 failed, 596 -> 86 -> 510 lines/s before/during/after. Rebuilt (main at f8c1621,
load average 4-5): 0 of 20,000 failed, none twice or missing, 56.1 s (357 lines/s);
613 -> 23 -> 476 lines/s; SeaweedFS away 20.5 s, most of it its master's raft election on
restart (SeaweedFS's default election timeout is 10 s; harness/seaweed.py now sets 1 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults import main

if __name__ == "__main__":
    raise SystemExit(main(faults="seaweed@13000"))
