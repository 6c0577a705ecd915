#!/usr/bin/env python3
"""User-space instructions per operation inside the measured loop, from
callgrind profiles of a client (scripts/count-instructions.sh).

Usage: count_instructions.py RUN_DIR MANIFEST PERFTEST_CHECK

MANIFEST is a TSV written by scripts/count-instructions.sh, one run a
line: test, tool (perftest, pinpoll-as-perftest, pinpoll), variant (n1 |
n2 | crowded), operations, the callgrind output prefix, the client's
executable. PERFTEST_CHECK holds perftest_identity.py's PROG.differing.tsv
lists: a perftest function that differs from the installed program's must
not run inside a counted loop. Prints Markdown tables on stdout and writes
RUN_DIR/counts.json and RUN_DIR/table.md.

The method is described in scripts/count-instructions.sh (--help) and
printed under the tables (METHOD below).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind_profile as cp  # noqa: E402

# Objects by what they are; "own" is the client's executable.
CATEGORIES = (
    ("provider", ("librxe", "libmlx5")),
    ("libibverbs", ("libibverbs.so",)),
    ("libc", ("libc.so",)),
)
COLUMNS = ("own", "provider", "libibverbs", "libc", "other")
# The most times an instruction may run per empty turn of one loop and be
# counted as that loop's (a provider's poll walks a few entries per call).
MOST_PER_TURN = 16
# Loops (by count change, largest first) an instruction's change may be the
# sum of: a wait loop's head runs once per turn of each path back to it.
# Few, so that a sum of small changes cannot match by accident.
COMBINED_LOOPS = 4


def category(obj: str, own: str) -> str:
    if obj == own:
        return "own"
    base = os.path.basename(obj or "???")
    for name, keys in CATEGORIES:
        if any(k in base for k in keys):
            return name
    return "other"


@dataclass
class Run:
    test: str
    tool: str
    variant: str
    ops: int
    own: str
    profile: cp.ThreadProfile


def merged(profiles: list) -> cp.ThreadProfile:
    out = cp.ThreadProfile(path="+".join(p.path for p in profiles))
    for p in profiles:
        out.objects.update(p.objects)
        out.functions.update(p.functions)
        out.instructions.update(p.instructions)
        out.function_of.update(p.function_of)
        out.back_edges.update(p.back_edges)
        out.calls.update(p.calls)
        out.call_costs.update(p.call_costs)
    return out


def load_run(fields: list[str]) -> Run:
    test, tool, variant, ops, prefix, own = fields
    files = cp.thread_files(prefix)
    if not files:
        raise SystemExit(f"error: no callgrind output for {prefix}")
    # Only the thread that ran the measured loop collected anything.
    profiles = [p for p in (cp.parse(f) for f in files) if p.self_total()]
    if not profiles:
        raise SystemExit(f"error: {prefix}: nothing was counted: the measured loop's "
                         "function was not found (--toggle-collect)")
    return Run(test, tool, variant, int(ops), own, merged(profiles))


def check_identical(run: Run, perftest_bin: str) -> None:
    """A perftest function that differs from the installed program's must
    not have run inside the counted loop."""
    listing = os.path.join(perftest_bin, os.path.basename(run.own) + ".differing.tsv")
    if not os.path.exists(listing):
        raise SystemExit(f"error: {listing} is missing: scripts/count-instructions.sh checks --perftest-bin first")
    with open(listing, encoding="utf-8") as f:
        differing = {line.split("\t")[0] for line in f if line.strip()}
    ran = {fn for (ob, fn), cost in run.profile.functions.items() if ob == run.own and cost}
    bad = sorted(differing & ran)
    if bad:
        raise SystemExit(f"error: {run.own}: {', '.join(bad)} ran inside the counted loop but "
                         "differs from the installed program's: the count is not the installed one's")


def explain(d: int, deltas: list) -> list | None:
    """The loops an instruction's count change `d` is made of: one loop
    m times (m <= MOST_PER_TURN), else m1 times one and m2 times another
    of the loops that changed most (an instruction several paths reach:
    a provider's poll called once per turn of one wait and twice per turn
    of another), else three of them up to 4 times each."""
    for key, dt in deltas:
        if dt and d % dt == 0 and 1 <= d // dt <= MOST_PER_TURN:
            return [(key, d // dt)]
    top = deltas[:COMBINED_LOOPS]
    for (k1, d1), (k2, d2) in itertools.combinations(top, 2):
        for m1 in range(1, MOST_PER_TURN + 1):
            rest = d - m1 * d1
            if d2 and rest % d2 == 0 and 1 <= rest // d2 <= MOST_PER_TURN:
                return [(k1, m1), (k2, rest // d2)]
    for combo in itertools.combinations(top, 3):
        for ms in itertools.product(range(1, 5), repeat=3):
            if sum(m * dt for m, (_k, dt) in zip(ms, combo)) == d:
                return [(k, m) for m, (k, _dt) in zip(ms, combo)]
    return None


@dataclass
class Waiting:
    """The wait loops of one tool and test, and what each instruction
    (object, address) runs per empty turn."""
    loops: list  # [(jump key, {variant: times taken})], busiest first
    parts: dict  # (object, address) -> [(jump key, times per empty turn)]
    proportional: dict  # (object, address) -> share per turn of the busiest loop

    def turns(self, key, variant: str) -> int:
        """A wait loop is left when it finds its event: its backward jump
        is taken once per empty turn."""
        return dict(self.loops)[key][variant]

    def removed(self, variant: str, own: str) -> tuple[collections.Counter, collections.Counter]:
        """Instructions of empty turns in run `variant`, by category: all
        of them, and the part that is an estimate."""
        total, estimated = collections.Counter(), collections.Counter()
        for (obj, _a), parts in self.parts.items():
            total[category(obj, own)] += sum(m * self.turns(k, variant) for k, m in parts)
        if self.loops:
            busiest = self.turns(self.loops[0][0], variant)
            for (obj, _a), share in self.proportional.items():
                total[category(obj, own)] += share * busiest
                estimated[category(obj, own)] += share * busiest
        return total, estimated

    def all_turns(self, variant: str) -> int:
        return sum(self.turns(k, variant) for k, _ in self.loops)


def find_waiting(profs: dict, own: str) -> Waiting:
    """Wait loops from the n1 and crowded runs (the same work)."""
    variants = ("n1", "n2", "crowded")
    edges = set()
    for v in ("n1", "crowded"):
        edges |= {k for k in profs[v].back_edges if k[0] == own}
    # Backward jumps taken as often as each other in every run close the
    # same loop: one of them stands for all.
    groups: dict = {}
    for e in sorted(edges):
        taken = tuple(profs[v].back_edges.get(e, 0) for v in variants)
        if taken[0] != taken[2]:
            groups.setdefault(taken, e)
    loops = sorted(((key, dict(zip(variants, taken))) for taken, key in groups.items()),
                   key=lambda kv: -abs(kv[1]["crowded"] - kv[1]["n1"]))
    deltas = [(key, t["crowded"] - t["n1"]) for key, t in loops]
    parts, proportional = {}, {}
    ref, crowd = profs["n1"].instructions, profs["crowded"].instructions
    for a in set(ref) | set(crowd):
        d = crowd.get(a, 0) - ref.get(a, 0)
        if d == 0:
            continue
        found = explain(d, deltas)
        if found:
            parts[a] = found
        elif deltas:
            proportional[a] = d / deltas[0][1]
    return Waiting(loops, parts, proportional)


def by_category(prof: cp.ThreadProfile, own: str) -> collections.Counter:
    out = collections.Counter()
    for obj, cost in prof.objects.items():
        out[category(obj, own)] += cost
    return out


def provider_calls(prof: cp.ThreadProfile, own: str) -> collections.Counter:
    """Calls from the executable into the provider, by callee."""
    counts = collections.Counter()
    for (caller, _caller_fn, callee, fn), n in prof.calls.items():
        if caller == own and category(callee, own) == "provider":
            counts[fn] += n
    return counts


def cq_polls_per_op(profs: dict, own: str, dops: int) -> float:
    """Calls per operation of the provider function the executable calls
    most often, its post (the one that calls write(2), rxe's doorbell)
    aside: the CQ poll."""
    posts = {caller_fn for (caller, caller_fn, _c, fn), _n in profs["n2"].calls.items()
             if category(caller, own) == "provider" and fn == "write"}
    c1, c2 = provider_calls(profs["n1"], own), provider_calls(profs["n2"], own)
    growth = [(c2[fn] - c1.get(fn, 0)) / dops for fn in c2 if fn not in posts]
    return max(growth, default=0.0)


def analyse(runs: dict) -> dict:
    """Per operation figures of one tool and test from its runs."""
    r1, r2 = runs["n1"], runs["n2"]
    own, dops = r1.own, r2.ops - r1.ops
    profs = {v: r.profile for v, r in runs.items()}
    raw = {v: by_category(p, own) for v, p in profs.items()}
    removed = {v: collections.Counter() for v in profs}
    estimated = {v: collections.Counter() for v in profs}
    turns_per_op = None
    if "crowded" in profs:
        w = find_waiting(profs, own)
        for v in profs:
            removed[v], estimated[v] = w.removed(v, own)
        turns_per_op = (w.all_turns("n2") - w.all_turns("n1")) / dops
    per_op = {c: ((raw["n2"][c] - removed["n2"][c]) - (raw["n1"][c] - removed["n1"][c])) / dops
              for c in COLUMNS}
    per_op["user space"] = sum(per_op[c] for c in COLUMNS)
    sums = lambda counters: sum(counters.values())  # noqa: E731
    return {
        "ops": {v: r.ops for v, r in runs.items()},
        "per_op": per_op,
        "with_waiting_per_op": (sums(raw["n2"]) - sums(raw["n1"])) / dops,
        "waiting_per_op": (sums(removed["n2"]) - sums(removed["n1"])) / dops,
        "estimated_per_op": (sums(estimated["n2"]) - sums(estimated["n1"])) / dops,
        "empty_turns_per_op": turns_per_op,
        "cq_polls_per_op": cq_polls_per_op(profs, own, dops),
    }


# ---- the tables --------------------------------------------------------------

ROWS = (
    ("write-lat", "write-lat 8 B", "round trip (ping + pong)"),
    ("send-lat", "send-lat 8 B", "round trip (ping + pong)"),
    ("read-lat", "read-lat 8 B", "round trip (one READ)"),
    ("write-bw", "write-bw 64 B, 32 per post", "work request"),
)
TOOLS = (("perftest", "perftest"), ("pinpoll-as-perftest", "pinpoll-perf as perftest"),
         ("pinpoll", "pinpoll-perf as meant"))


def ratio_text(ours: dict | None, theirs: dict | None, column: str) -> str:
    if not ours or not theirs or not theirs["per_op"][column]:
        return "n/a"
    return f"{ours['per_op'][column] / theirs['per_op'][column]:.2f}×"


def summary(results: dict, column: str) -> list[str]:
    out = [f"| test | per | perftest | pinpoll-perf as perftest | ratio | pinpoll-perf as meant | ratio |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for test, label, per in ROWS:
        pt, same, meant = (results.get((test, t)) for t, _l in TOOLS)
        if not (pt or same or meant):
            continue
        cell = lambda r: f"{r['per_op'][column]:.1f}" if r else "n/a"  # noqa: E731
        out.append(f"| {label} | {per} | {cell(pt)} | {cell(same)} | {ratio_text(same, pt, column)} "
                   f"| {cell(meant) if test != 'write-bw' else '—'} "
                   f"| {ratio_text(meant, pt, column) if test != 'write-bw' else '—'} |")
    return out


def details(results: dict) -> list[str]:
    out = ["| test | tool | " + " | ".join(c for c in COLUMNS) + " | user space | with waiting "
           "| waiting removed | of which estimated | empty turns | CQ polls |",
           "|---|---|" + "---:|" * (len(COLUMNS) + 6)]
    for test, _label, _per in ROWS:
        for tool, name in TOOLS:
            r = results.get((test, tool))
            if not r:
                continue
            p = r["per_op"]
            turns = "—" if r["empty_turns_per_op"] is None else f"{r['empty_turns_per_op']:.1f}"
            out.append(f"| {test} | {name} | " + " | ".join(f"{p[c]:.1f}" for c in COLUMNS)
                       + f" | {p['user space']:.1f} | {r['with_waiting_per_op']:.1f} "
                       f"| {r['waiting_per_op']:.1f} | {r['estimated_per_op']:.1f} | {turns} "
                       f"| {r['cq_polls_per_op']:.3f} |")
    return out


METHOD = (
    "Method: callgrind (Ir) on the client only, server native, counting only inside the "
    "measured loop (--collect-atstart=no --toggle-collect: perftest's run_iter_* less "
    "get_cpu_mhz, pinpoll-perf's timed_round_trips / timed_stream), with everything they "
    "call. own = the client's executable (perftest built from the installed package's "
    "source with its flags, the counted functions byte-identical to the installed ones; "
    "pinpoll-perf with pinpoll and what the loop inlines); provider = librxe; user space = "
    "every object. per op = (count(N2) - count(N1)) / (ops(N2) - ops(N1)) after removing "
    "busy-wait turns that found nothing, the same way for both tools and every object: wait "
    "loops are the executable's backward jumps whose taken count changes when the server "
    "shares the client's core (a third run at N1); an instruction whose count changes by m "
    "times a loop's change (m <= 16, or by m1 and m2 times two loops' changes) runs m times per "
    "empty turn and is removed that often; one no loop explains is removed in proportion to "
    "the busiest loop's empty turns (the 'estimated' column). Latency rows are per round trip, "
    "write-bw per work request (nothing removed: its empty CQ polls are part of the figure, "
    "as perftest's)."
)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    run_dir, manifest, perftest_bin = argv[1:]
    runs: dict = collections.defaultdict(dict)
    with open(manifest, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 6:
                continue
            run = load_run(fields)
            if run.tool == "perftest":
                check_identical(run, perftest_bin)
            runs[(fields[0], fields[1])][fields[2]] = run
    results = {}
    for (test, tool), by_variant in sorted(runs.items()):
        need = {"n1", "n2"} | ({"crowded"} if test != "write-bw" else set())
        if not need <= set(by_variant):
            print(f"warning: {test} {tool}: missing a run ({', '.join(sorted(need - set(by_variant)))}), "
                  "no figure", file=sys.stderr)
            continue
        results[(test, tool)] = analyse(by_variant)
    lines = (["Own executable, instructions per operation:", ""] + summary(results, "own")
             + ["", "User space (every object), instructions per operation:", ""]
             + summary(results, "user space")
             + ["", "By object, per operation:", ""] + details(results) + ["", METHOD])
    print("\n".join(lines))
    with open(os.path.join(run_dir, "counts.json"), "w", encoding="utf-8") as f:
        json.dump([{"test": t, "tool": tool, **r} for (t, tool), r in sorted(results.items())],
                  f, indent=1)
    with open(os.path.join(run_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
