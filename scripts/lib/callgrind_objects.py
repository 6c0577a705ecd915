#!/usr/bin/env python3
"""Self instructions (Ir) per object in callgrind output files.

Usage: callgrind_objects.py OWN_OBJECT FILE...

Prints, for each FILE, one tab-separated line: the file, its total self Ir,
then OWN (self Ir of objects whose path contains OWN_OBJECT), provider
(librxe / libmlx5), libibverbs, librdmacm, libc, and the rest. A call's
inclusive cost (the cost line after `calls=`) is charged to the callee's
own lines, never to its caller, so nothing is counted twice. Handles
callgrind's compressed names (`ob=(3) /path`, later `ob=(3)`).
"""

from __future__ import annotations

import collections
import re
import sys

CATEGORIES = (
    ("provider", ("librxe", "libmlx5")),
    ("libibverbs", ("libibverbs.so",)),
    ("librdmacm", ("librdmacm",)),
    ("libc", ("libc.so", "libc-")),
)

NAMED = re.compile(r"\((\d+)\)(?: (.*))?")


def self_cost_by_object(path: str) -> collections.Counter:
    cost: collections.Counter = collections.Counter()
    names: dict[str, str] = {}
    ob = None
    after_call = False
    positions = 1  # "positions: line" unless the header says more

    def name(spec: str) -> str:
        m = NAMED.fullmatch(spec)
        if not m:
            return spec
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), spec)

    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line:
                continue
            if line.startswith("positions:"):
                positions = len(line.split()[1:])
            elif line.startswith("ob="):
                ob = name(line[3:])
            elif line.startswith("cob="):
                name(line[4:])
            elif line.startswith("calls="):
                after_call = True
            elif line[0].isdigit() or line[0] in "+-*":
                if after_call:
                    after_call = False
                    continue
                # Positions, then the events; Ir is the first event.
                parts = line.split()
                if len(parts) > positions:
                    cost[ob] += int(parts[positions])
    return cost


def category(obj: str, own: str) -> str:
    if own in (obj or ""):
        return "own"
    for label, needles in CATEGORIES:
        if any(n in (obj or "") for n in needles):
            return label
    return "other"


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    own = sys.argv[1]
    labels = ["own"] + [c[0] for c in CATEGORIES] + ["other"]
    print("\t".join(["file", "total"] + labels))
    for path in sys.argv[2:]:
        split: collections.Counter = collections.Counter()
        for obj, ir in self_cost_by_object(path).items():
            split[category(obj, own)] += ir
        total = sum(split.values())
        print("\t".join([path, str(total)] + [str(split[l]) for l in labels]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
