#!/usr/bin/env python3
"""Own instructions per operation from callgrind profiles of a client.

Usage: count_instructions.py RUN_DIR MANIFEST

MANIFEST is a TSV written by scripts/count-instructions.sh, one run a
line: test, tool, variant (n1 | n2 | crowded), iterations, ops per
iteration, the callgrind output prefix, the tool's own binary. Prints
the Markdown table on stdout and writes RUN_DIR/counts.json and
RUN_DIR/counts.tsv with every figure.

The method is described in scripts/count-instructions.sh (--help) and
printed under the table (METHOD below).
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

# Objects that are not the tool's own code, for the breakdown.
CATEGORIES = (
    ("provider", ("librxe",)),
    ("libibverbs", ("libibverbs.so",)),
    ("librdmacm", ("librdmacm",)),
    ("libc", ("libc.so",)),
    ("ld.so", ("ld-linux",)),
    ("valgrind", ("vgpreload",)),
)


def category(obj: str, own: str) -> str:
    if obj == own:
        return "own"
    base = os.path.basename(obj or "???")
    for name, keys in CATEGORIES:
        if any(k in base for k in keys):
            return name
    return "vdso/other" if base == "???" else "other"


@dataclass
class Run:
    test: str
    tool: str
    variant: str
    iters: int
    ops_per_iter: int
    prefix: str
    own: str
    threads: dict  # role -> list[ThreadProfile]
    # Empty turns of the application thread's busy-waits, as the tool
    # counted them (pinpoll-perf's JSON `wait_turns`); None when it does
    # not report them (perftest).
    wait_turns: int | None = None

    @property
    def ops(self) -> int:
        return self.iters * self.ops_per_iter


def thread_role(index: int) -> str:
    """The first thread is main, the application's; the tools start one
    more only in engine mode: pinpoll's worker."""
    return "app" if index == 0 else "worker"


def load_run(fields: list[str]) -> Run:
    test, tool, variant, iters, per, prefix, own = fields
    files = cp.thread_files(prefix)
    if not files:
        raise SystemExit(f"error: no callgrind output for {prefix}")
    threads: dict = collections.defaultdict(list)
    for i, f in enumerate(files):
        prof = cp.parse(f)
        if prof.self_total():
            threads[thread_role(i)].append(prof)
    run = Run(test, tool, variant, int(iters), int(per), prefix, own, dict(threads))
    run.wait_turns = reported_wait_turns(prefix)
    return run


def reported_wait_turns(prefix: str) -> int | None:
    """`wait_turns` summed over the results of the tool's --json output
    (PREFIX.txt beside PREFIX's callgrind files, after valgrind's lines)."""
    path = prefix[: -len(".cg")] + ".txt" if prefix.endswith(".cg") else prefix + ".txt"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        doc = json.loads(text[text.index("{") : text.rindex("}") + 1])
    except (OSError, ValueError):
        return None
    turns = [r.get("wait_turns") for r in doc.get("results", [])]
    if not turns or any(t is None for t in turns):
        return None
    return sum(turns)


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


# libc's qsort (a merge sort) calls perftest's comparator N log N times
# when the report sorts the samples: reporting, not per-operation work.
SORT_CALLERS = ("msort", "qsort")
# pinpoll-perf's mean, deviation and percentiles walk its histogram's
# buckets: as many turns as the latencies spread over, not per operation.
# (Filling the histogram, one record per sample, is inlined into the
# measuring code and stays in, as perftest's own pass over its samples.)
REPORT_FUNCTIONS = ("hdrhistogram::",)


def sort_callbacks(prof: cp.ThreadProfile, own: str) -> tuple:
    """Own functions called by libc's sort, and their inclusive cost."""
    fns, cost = set(), 0
    for (caller, caller_fn, callee, fn), c in prof.call_costs.items():
        if (
            callee == own
            and category(caller, own) == "libc"
            and (caller_fn or "").startswith(SORT_CALLERS)
        ):
            fns.add(fn)
            cost += c
    return fns, cost


@dataclass
class Waiting:
    """Wait loops of one role and the instructions of their empty turns."""

    loops: list  # [(jump key, {variant: times taken})]
    per_turn: dict  # jump key -> own instructions per empty turn
    once: dict  # jump key -> addresses that run once per empty turn
    # address -> share per empty turn of the busiest loop, for instructions
    # no loop explains (work done every so many turns of a wait: a clock
    # read, a peer check, a yield), removed in proportion to that loop
    proportional: dict

    def empty_turns(self, key, counts: dict, variant: str) -> int:
        """A loop that is left when it finds its event takes its backward
        jump once per empty turn. One that never ends (engine mode's
        worker) takes it after busy turns too; then an instruction that
        runs on empty turns only (the fewest runs of those that run once
        per empty turn) counts them."""
        taken = dict(self.loops)[key][variant]
        fewest = min((counts.get(a, 0) for a in self.once[key]), default=taken)
        return min(taken, fewest)

    def removed(self, counts: dict, variant: str) -> float:
        return self.removed_exactly(counts, variant) + self.removed_in_proportion(counts, variant)

    def removed_exactly(self, counts: dict, variant: str) -> int:
        return sum(
            self.per_turn[key] * self.empty_turns(key, counts, variant) for key, _ in self.loops
        )

    def removed_in_proportion(self, counts: dict, variant: str) -> float:
        if not self.loops:
            return 0.0
        turns = self.empty_turns(self.loops[0][0], counts, variant)
        return sum(self.proportional.values()) * turns

    def turns(self, counts: dict, variant: str) -> int:
        return sum(self.empty_turns(key, counts, variant) for key, _ in self.loops)


def own_counts(prof: cp.ThreadProfile, own: str, skip_fns: set) -> dict:
    """address -> executions, own object, outside the skipped functions."""
    return {
        a: n
        for (o, a), n in prof.instructions.items()
        if o == own and prof.function_of.get((o, a)) not in skip_fns
    }


# Loops (by count change, largest first) an instruction's change may be
# the sum of: a wait loop's head runs once per turn of each path back to
# it (a plain empty turn, a turn that reads the clock every 256, ...).
# Few, so that a sum of small changes cannot match by accident.
COMBINED_LOOPS = 4


def explain(d: int, deltas: list) -> list | None:
    """The loops an instruction's count change `d` is made of: one loop
    m times (m <= 4), else two or three of the loops that changed most,
    once each."""
    for key, dt in deltas:
        for m in range(1, 5):
            if m * dt == d:
                return [(key, m)]
    for size in (2, 3):
        for combo in itertools.combinations(deltas[:COMBINED_LOOPS], size):
            if sum(dt for _k, dt in combo) == d:
                return [(k, 1) for k, _dt in combo]
    return None


def find_waiting(profs: dict, counts: dict, own: str) -> Waiting:
    """Wait loops from the n2 and crowded runs (same iteration count)."""
    variants = ("n1", "n2", "crowded")
    edges = set()
    for v in ("n2", "crowded"):
        edges |= {k for k in profs[v].back_edges if k[0] == own and k[1] in counts[v]}
    # Backward jumps taken as often as each other in every run close the
    # same loop: one of them stands for all.
    groups: dict = {}
    for e in sorted(edges):
        taken = tuple(profs[v].back_edges.get(e, 0) for v in variants)
        if taken[1] != taken[2]:
            groups.setdefault(taken, e)
    loops = sorted(
        ((key, dict(zip(variants, taken))) for taken, key in groups.items()),
        key=lambda kv: -abs(kv[1]["crowded"] - kv[1]["n2"]),
    )
    deltas = [(key, t["crowded"] - t["n2"]) for key, t in loops]
    per_turn = {key: 0 for key, _ in loops}
    once: dict = {key: [] for key, _ in loops}
    proportional = {}
    ref, crowd = counts["n2"], counts["crowded"]
    for a in sorted(set(ref) | set(crowd)):
        d = crowd.get(a, 0) - ref.get(a, 0)
        if d == 0:
            continue
        parts = explain(d, deltas)
        if parts:
            for key, m in parts:
                per_turn[key] += m
            if len(parts) == 1 and parts[0][1] == 1:
                once[parts[0][0]].append(a)
        else:
            proportional[a] = d / deltas[0][1]
    return Waiting(loops, per_turn, once, proportional)


def provider_calls(prof: cp.ThreadProfile, own: str) -> collections.Counter:
    """Calls from the own object into the provider, by callee (librxe
    has no symbols: callees are addresses)."""
    counts = collections.Counter()
    for (caller, _caller_fn, callee, fn), n in prof.calls.items():
        if caller == own and category(callee, own) == "provider":
            counts[fn] += n
    return counts


def doorbells(prof: cp.ThreadProfile) -> set:
    """Provider functions that call write(2): rxe's post_send rings its
    doorbell with a write on the device file."""
    return {
        caller_fn
        for (caller, caller_fn, _callee, fn), _n in prof.calls.items()
        if category(caller, "") == "provider" and fn == "write"
    }


def cq_polls_per_op(profs: dict, own: str, dops: int) -> tuple:
    """The CQ poll and its calls per operation: of the provider functions
    the own object calls, not post_send, the one whose calls grow most
    per operation (it runs once per completion taken or more, and again
    on every empty poll; post_recv at most once per operation)."""
    c1, c2 = provider_calls(profs["n1"], own), provider_calls(profs["n2"], own)
    posts = doorbells(profs["n2"])
    growth = {fn: (c2[fn] - c1.get(fn, 0)) / dops for fn in c2 if fn not in posts}
    if not growth:
        return None, 0.0
    fn = max(sorted(growth), key=lambda f: growth[f])
    return fn, growth[fn]


def remove_counted_waiting(raw: dict, turns: dict, dops: int) -> tuple[dict, dict]:
    """Waiting taken out with the tool's own count of empty turns T: own =
    a * ops + b * T + c in every run; the crowded run repeats N2's work
    with other turns, so b = (own(crowded) - own(N2)) / (T(crowded) -
    T(N2)), and b * T is removed from each run. Exact as long as an empty
    turn costs the same on average in both runs (the clock check every so
    many turns included)."""
    dt = turns["crowded"] - turns["n2"]
    per_turn = (raw["crowded"] - raw["n2"]) / dt if dt else 0.0
    removed = {v: per_turn * turns[v] for v in raw}
    return removed, dict(
        method="counted turns",
        own_per_turn=per_turn,
        waiting_removed=removed,
        turns=turns,
        turns_per_op=(turns["n2"] - turns["n1"]) / dops,
        waiting_per_op=(removed["n2"] - removed["n1"]) / dops,
        proportional_per_op=0.0,
    )


def analyse_role(profs: dict, own: str, dops: int, n2_ops: int, turns: dict | None = None) -> dict:
    sorts = {v: sort_callbacks(p, own) for v, p in profs.items()}
    skip = set().union(*(fns for fns, _ in sorts.values()))
    skip |= {
        fn
        for p in profs.values()
        for (ob, fn) in p.functions
        if ob == own and fn and any(r in fn for r in REPORT_FUNCTIONS)
    }
    counts = {v: own_counts(p, own, skip) for v, p in profs.items()}
    raw = {v: sum(c.values()) for v, c in counts.items()}
    entry = {
        "own_self": {v: p.objects.get(own, 0) for v, p in profs.items()},
        "sort_callbacks": {v: c for v, (_f, c) in sorts.items()},
        "own_raw": raw,
    }
    own_adj = dict(raw)
    if turns is not None and "crowded" in profs:
        removed, facts = remove_counted_waiting(raw, turns, dops)
        own_adj = {v: raw[v] - removed[v] for v in profs}
        entry.update(facts)
    elif "crowded" in profs:
        w = find_waiting(profs, counts, own)
        removed = {v: w.removed(counts[v], v) for v in profs}
        own_adj = {v: raw[v] - removed[v] for v in profs}
        in_proportion = {v: w.removed_in_proportion(counts[v], v) for v in profs}
        entry.update(
            # Part of the removal that is an estimate, not a count.
            proportional_per_op=(in_proportion["n2"] - in_proportion["n1"]) / dops,
            loops=[
                {"jump": f"{k[1]:#x}->{k[2]:#x}", "taken": t, "own_per_turn": w.per_turn[k]}
                for k, t in w.loops
            ],
            estimated_addresses=len(w.proportional),
            waiting_removed=removed,
            turns={v: w.turns(counts[v], v) for v in profs},
            turns_per_op=(w.turns(counts["n2"], "n2") - w.turns(counts["n1"], "n1")) / dops,
            waiting_per_op=(removed["n2"] - removed["n1"]) / dops,
        )
    entry["own_adjusted"] = own_adj
    entry["own_per_op"] = (own_adj["n2"] - own_adj["n1"]) / dops
    entry["raw_per_op"] = (raw["n2"] - raw["n1"]) / dops
    fn, per_op = cq_polls_per_op(profs, own, dops)
    entry["provider_busiest"] = fn
    entry["provider_busiest_calls_per_op"] = per_op
    cats = collections.Counter()
    for v, sign in (("n2", 1), ("n1", -1)):
        for obj, cost in profs[v].objects.items():
            cats[category(obj, own)] += sign * cost
    entry["self_per_op_by_object"] = {k: v / dops for k, v in sorted(cats.items())}
    return entry


def analyse(test: str, tool: str, runs_by_variant: dict) -> dict:
    r1, r2 = runs_by_variant["n1"], runs_by_variant["n2"]
    dops = r2.ops - r1.ops
    roles = sorted(set(r1.threads) | set(r2.threads))
    result = {"test": test, "tool": tool, "ops": {"n1": r1.ops, "n2": r2.ops}, "roles": {}}
    for role in roles:
        profs = {v: merged(r.threads.get(role, [])) for v, r in runs_by_variant.items()}
        turns = {v: r.wait_turns for v, r in runs_by_variant.items()}
        counted = role == "app" and all(t is not None for t in turns.values())
        result["roles"][role] = analyse_role(profs, r1.own, dops, r2.ops, turns if counted else None)
    return result


# ---- the table ---------------------------------------------------------------

ROWS = (
    ("write-lat", "write-lat 8 B", "round trip (ping + pong)"),
    ("send-lat", "send-lat 8 B", "round trip (ping + pong)"),
    ("read-lat", "read-lat 8 B", "round trip (one READ)"),
    ("write-bw", "write-bw 64 B, 32 per post", "work request"),
    ("engine-read-lat", "engine read-lat 8 B", "round trip (one READ)"),
    ("engine-send-lat", "engine send-lat 8 B", "round trip (ping + pong)"),
)
# Engine rows are set against perftest's direct test of the same kind.
PERFTEST_PEER = {"engine-read-lat": "read-lat", "engine-send-lat": "send-lat"}


def own_total(res: dict) -> float:
    return sum(e["own_per_op"] for e in res["roles"].values())


def spins_cell(res: dict) -> str:
    parts = []
    for role, e in sorted(res["roles"].items()):
        polls = e["provider_busiest_calls_per_op"]
        if "turns_per_op" in e:
            v = f"{e['turns_per_op']:.1f} empty turns ({polls:.2f} CQ polls)"
        else:
            v = f"{polls:.3f} CQ polls"
        parts.append(v if len(res["roles"]) == 1 else f"{role} {v}")
    return ", ".join(parts)


def own_cell(res: dict) -> str:
    roles = res["roles"]
    if len(roles) == 1:
        return f"{own_total(res):.1f}"
    inner = " + ".join(f"{r} {roles[r]['own_per_op']:.1f}" for r in ("app", "worker") if r in roles)
    return f"{own_total(res):.1f} ({inner})"


def table(results: dict) -> list[str]:
    out = [
        "| test | per | perftest own/op | pinpoll own/op | pinpoll/perftest "
        "| spins/op perftest | spins/op pinpoll |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for test, label, per in ROWS:
        pp = results.get((test, "pinpoll"))
        pt = results.get((PERFTEST_PEER.get(test, test), "perftest"))
        if pp is None and (pt is None or test in PERFTEST_PEER):
            continue
        pt_own = f"{own_total(pt):.1f}" if pt else "n/a"
        if test in PERFTEST_PEER and pt:
            pt_own = f"({pt_own}: ib_{PERFTEST_PEER[test].replace('-', '_')})"
        ratio = f"{own_total(pp) / own_total(pt):.2f}" if pp and pt and own_total(pt) else "n/a"
        out.append(
            f"| {label} | {per} | {pt_own} | {own_cell(pp) if pp else 'n/a'} | {ratio} "
            f"| {'—' if test in PERFTEST_PEER else (spins_cell(pt) if pt else 'n/a')} "
            f"| {spins_cell(pp) if pp else 'n/a'} |"
        )
    return out


def details(results: dict) -> list[str]:
    """Per tool and thread: what was counted, removed and left."""
    out = [
        "| test | tool | thread | own/op with waiting | waiting removed/op | of which estimated | own/op "
        "| provider/op | libibverbs/op | libc/op |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (test, tool), res in sorted(results.items()):
        for role, e in sorted(res["roles"].items()):
            by = e["self_per_op_by_object"]
            estimated = e.get("proportional_per_op", 0.0)
            out.append(
                f"| {test} | {tool} | {role} | {e['raw_per_op']:.1f} "
                f"| {e.get('waiting_per_op', 0.0):.1f} | {estimated:.1f} | {e['own_per_op']:.1f} "
                f"| {by.get('provider', 0.0):.1f} "
                f"| {by.get('libibverbs', 0.0):.1f} | {by.get('libc', 0.0):.1f} |"
            )
    return out


METHOD = (
    "Method: callgrind (Ir) on the client only, server native. own = self "
    "instructions of the tool's own object (the perftest binary; pinpoll-perf, "
    "with pinpoll and std linked in), excluding librxe, libibverbs, librdmacm, "
    "libc, ld.so, the vDSO and valgrind's preload, and reporting that is not per "
    "operation (perftest's qsort comparator, pinpoll-perf's histogram walks). "
    "own/op = (own(N2) - own(N1)) / (ops(N2) - ops(N1)) after removing busy-wait "
    "turns that found nothing: wait loops are backward jumps whose taken count "
    "changes when the server shares the client's core (a third run at N2); an "
    "instruction whose count changes by m times a loop's change (or by the sum "
    "of a few loops' changes) runs m times per empty turn and is removed that "
    "often; one no loop explains (a clock read or peer check every so many "
    "turns) is removed in proportion to the busiest loop's empty turns (the "
    "'estimated' column). Where the tool counts its own empty turns "
    "(pinpoll-perf's JSON wait_turns, direct mode) the removal uses them "
    "instead: own = a*ops + b*turns + c in all three runs, b from the N2 and "
    "crowded runs, nothing estimated. spins/op = empty turns "
    "per operation; write-bw: CQ-poll calls per work request (one completion per "
    "32), nothing removed."
)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    run_dir, manifest = argv[1], argv[2]
    runs: dict = collections.defaultdict(dict)
    with open(manifest, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 7:
                continue
            runs[(fields[0], fields[1])][fields[2]] = load_run(fields)
    results = {}
    for (test, tool), by_variant in sorted(runs.items()):
        if not {"n1", "n2"} <= set(by_variant):
            print(f"warning: {test} {tool}: missing a run, no figure", file=sys.stderr)
            continue
        results[(test, tool)] = analyse(test, tool, by_variant)
    lines = table(results) + [""] + details(results) + ["", METHOD]
    print("\n".join(lines))
    with open(os.path.join(run_dir, "counts.json"), "w", encoding="utf-8") as f:
        json.dump([results[k] for k in sorted(results)], f, indent=1, default=str)
    with open(os.path.join(run_dir, "counts.tsv"), "w", encoding="utf-8") as f:
        f.write("test\ttool\trole\town_per_op\traw_per_op\tturns_per_op\twaiting_per_op\t"
                "estimated_per_op\tprovider_calls_per_op\n")
        for (test, tool), res in sorted(results.items()):
            for role, e in sorted(res["roles"].items()):
                f.write(
                    f"{test}\t{tool}\t{role}\t{e['own_per_op']:.3f}\t{e['raw_per_op']:.3f}\t"
                    f"{e.get('turns_per_op', '')}\t{e.get('waiting_per_op', '')}\t"
                    f"{e.get('proportional_per_op', '')}\t{e['provider_busiest_calls_per_op']:.4f}\n"
                )
    with open(os.path.join(run_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
