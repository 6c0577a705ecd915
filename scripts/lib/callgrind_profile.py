"""Reads one callgrind.out file (one thread) into per-object self costs,
per-instruction counts, taken backward jumps and call counts.

Written for files from `valgrind --tool=callgrind --dump-instr=yes
--collect-jumps=yes --compress-strings=no --compress-pos=no` with the
single event Ir (see callgrind's "Callgrind Format Specification"):

- a cost line is "ADDR LINE IR": IR instructions executed at ADDR, self
  cost of the current function (fn=) in the current object (ob=);
- a `calls=COUNT TARGET` line is followed by one cost line that is the
  INCLUSIVE cost of those calls, charged to the call site: it is counted
  as a call, never as the caller's self cost;
- a `jump=COUNT TARGET` or `jcnd=TAKEN/EXECUTED TARGET` line is followed
  by the position of the jump instruction (no cost). (callgrind 3.19
  writes the taken count first; the smaller of the two is taken.)
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field


@dataclass
class ThreadProfile:
    path: str
    # object path -> self Ir
    objects: collections.Counter = field(default_factory=collections.Counter)
    # (object, function) -> self Ir
    functions: collections.Counter = field(default_factory=collections.Counter)
    # (object, address) -> times executed (self Ir at that address)
    instructions: collections.Counter = field(default_factory=collections.Counter)
    # (object, address) -> the function it was counted in
    function_of: dict = field(default_factory=dict)
    # (object, source address, target address) -> times taken, target <= source
    back_edges: collections.Counter = field(default_factory=collections.Counter)
    # (caller object, caller function, callee object, callee function) -> calls
    calls: collections.Counter = field(default_factory=collections.Counter)
    # the same key -> inclusive Ir of those calls
    call_costs: collections.Counter = field(default_factory=collections.Counter)
    totals: int | None = None

    def self_total(self) -> int:
        return sum(self.objects.values())


def _address(token: str) -> int:
    return int(token, 16) if token.startswith("0x") else int(token)


def parse(path: str) -> ThreadProfile:
    prof = ThreadProfile(path=path)
    ob = fn = None
    cob = cfn = None
    after_call = None  # key of the call whose inclusive cost comes next
    pending_jump = None  # (taken, target) waiting for its source position
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            head = line[0]
            if head.isdigit():
                parts = line.split()
                addr = _address(parts[0])
                if pending_jump is not None:
                    taken, target = pending_jump
                    pending_jump = None
                    if taken and target <= addr:
                        prof.back_edges[(ob, addr, target)] += taken
                    continue
                cost = int(parts[2]) if len(parts) > 2 else 0
                if after_call is not None:
                    prof.call_costs[after_call] += cost
                    after_call = None
                    continue
                if cost:
                    prof.objects[ob] += cost
                    prof.functions[(ob, fn)] += cost
                    prof.instructions[(ob, addr)] += cost
                    prof.function_of[(ob, addr)] = fn
                continue
            key, sep, value = line.partition("=")
            if not sep:
                if line.startswith("totals:"):
                    prof.totals = int(line.split()[1])
                continue
            if key == "ob":
                ob, cob = value, None
            elif key == "fn":
                fn, cob = value, None
            elif key == "cob":
                cob = value
            elif key == "cfn":
                cfn = value
            elif key == "calls":
                count = int(value.split()[0])
                after_call = (ob, fn, cob or ob, cfn)
                prof.calls[after_call] += count
                cob = None  # cob= names the target of one calls= line
            elif key == "jump":
                count, target = value.split()[:2]
                pending_jump = (int(count), _address(target))
            elif key == "jcnd":
                counts, target = value.split()[:2]
                taken = min(int(c) for c in counts.split("/"))
                pending_jump = (taken, _address(target))
            # fl, fi, fe, cfi, cfl, jfi, jfn: files and jump targets' names,
            # not needed (positions are absolute addresses).
    if prof.totals is not None and prof.totals != prof.self_total():
        raise ValueError(
            f"{path}: self costs add up to {prof.self_total()}, "
            f"the file's totals line says {prof.totals}"
        )
    return prof


def thread_files(prefix: str) -> list[str]:
    """The per-thread files of one run (--separate-threads=yes writes
    PREFIX-01, PREFIX-02, ...), in thread order."""
    d, base = os.path.split(prefix)
    names = sorted(
        n for n in os.listdir(d or ".")
        if n.startswith(base + "-") and n[len(base) + 1:].isdigit()
    )
    return [os.path.join(d, n) for n in names]
