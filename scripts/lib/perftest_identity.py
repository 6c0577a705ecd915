#!/usr/bin/env python3
"""Checks a perftest program built here against the installed one,
function by function.

usage: perftest_identity.py BUILT INSTALLED OUT.tsv

BUILT has symbols (nm -S lists its functions), INSTALLED is the stripped
program of the distribution. For every function of BUILT, its bytes are
compared with INSTALLED's bytes at the same address. OUT.tsv gets one line
per function that differs (name, address, size, differing bytes), which
count_instructions.py refuses to find inside a counted loop. Prints a
one-line summary; exits 1 when the two .text sections do not even start
at the same address with the same size (then nothing lines up).
"""

from __future__ import annotations

import subprocess
import sys


def text_section(path: str) -> tuple[int, int, int]:
    """(address, file offset, size) of .text, from `readelf -S -W`."""
    out = subprocess.run(["readelf", "-S", "-W", path], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[1] == ".text":
            return int(fields[3], 16), int(fields[4], 16), int(fields[5], 16)
    raise SystemExit(f"error: {path} has no .text section")


def functions(path: str) -> list[tuple[str, int, int]]:
    """(name, address, size) of every sized function symbol."""
    out = subprocess.run(["nm", "-S", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    fns = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in ("T", "t"):
            fns.append((fields[3], int(fields[0], 16), int(fields[1], 16)))
    return fns


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    built, installed, out = argv[1:]
    (addr_b, off_b, size_b), (addr_i, off_i, size_i) = text_section(built), text_section(installed)
    if (addr_b, size_b) != (addr_i, size_i):
        print(f"error: {built}'s .text (at {addr_b:#x}, {size_b} bytes) does not line up with "
              f"{installed}'s (at {addr_i:#x}, {size_i} bytes): another version or other flags",
              file=sys.stderr)
        return 1
    with open(built, "rb") as f:
        f.seek(off_b)
        text_b = f.read(size_b)
    with open(installed, "rb") as f:
        f.seek(off_i)
        text_i = f.read(size_i)
    fns = functions(built)
    differing = []
    for name, addr, size in fns:
        start = addr - addr_b
        if start < 0 or start + size > size_b:
            continue
        a, b = text_b[start:start + size], text_i[start:start + size]
        if a != b:
            differing.append((name, addr, size, sum(x != y for x, y in zip(a, b))))
    with open(out, "w", encoding="utf-8") as f:
        for name, addr, size, n in differing:
            f.write(f"{name}\t{addr:#x}\t{size}\t{n}\n")
    names = ", ".join(d[0] for d in differing) or "none"
    print(f"{built}: {len(fns) - len(differing)} of {len(fns)} functions byte-identical "
          f"to {installed}; differing: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
