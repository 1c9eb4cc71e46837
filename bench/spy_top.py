"""py-spy's raw profiles (`bench/fleet.py --profile DIR`) as top frames, thread by thread.

    python bench/spy_top.py DIR/run-sqlite-0.txt [more.txt ...] [--top 12]

For each thread, summed over the files given: its share of all samples (py-spy counts a
thread only while it is not idle), then its frames by inclusive share (the frame anywhere on
the stack, once per sample; frames on nearly every sample of the thread, the thread's own
loop, are left out) and by self share (the frame on top).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r'^((?:process \d+:"[^"]*";)*)thread \((\w+)\): ([^;]*);?(.*) (\d+)$')
#: A frame on more than this share of a thread's samples is its loop, not a cost.
LOOP_SHARE = 0.9


def short(frame: str) -> str:
    """`func (path/to/module.py:123)` as `func (module.py:123)`."""
    return re.sub(r"\(([^()]*/)?([^/()]+)\)$", r"(\2)", frame)


def load(paths: list[Path]) -> dict[str, list[tuple[list[str], int]]]:
    """Thread name -> its stacks (outermost frame first) with their sample counts."""
    threads: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if not m:
                continue
            command, _, name, frames, count = m.groups()
            stack = [short(f) for f in frames.split(";") if f]
            # `--subprocesses`: an upstream's client process is named as such.
            where = "client:" if command and "upstream.child" in command else ""
            threads[where + (name or "?")].append((stack, int(count)))
    return threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("profiles", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    threads = load(args.profiles)
    total = sum(n for stacks in threads.values() for _, n in stacks)
    if not total:
        print("no samples")
        return 1
    print(f"{total} samples")
    ranked = sorted(threads.items(), key=lambda kv: -sum(n for _, n in kv[1]))
    for name, stacks in ranked:
        samples = sum(n for _, n in stacks)
        inclusive: Counter[str] = Counter()
        own: Counter[str] = Counter()
        for stack, n in stacks:
            for frame in set(stack):
                inclusive[frame] += n
            if stack:
                own[stack[-1]] += n
        print(f"\n{name}: {samples} samples, {100 * samples / total:.0f}% of all")
        shown = [(f, c) for f, c in inclusive.most_common() if c <= LOOP_SHARE * samples]
        print("  inclusive (% of all samples):")
        for frame, c in shown[: args.top]:
            print(f"    {100 * c / total:5.1f}  {frame}")
        print("  self:")
        for frame, c in own.most_common(args.top // 2):
            print(f"    {100 * c / total:5.1f}  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
