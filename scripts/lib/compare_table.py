#!/usr/bin/env python3
"""The table of scripts/compare-perftest.sh: medians of interleaved rounds of
pinpoll-perf (JSON) and perftest (text), their ratio, the targets, a verdict.

usage: compare_table.py RESULTS.tsv RUN_DIR ELAPSED_SECONDS ROUNDS FILEXFER(yes|no)
Writes RUN_DIR/summary.json (every figure) and prints Markdown on stdout.
"""
import json
import math
import os
import re
import statistics
import sys


def perftest_figures(path):
    """Parses perftest's result table by its column names (robust to the
    spacing and tab mix perftest prints)."""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if "#bytes" not in line:
            continue
        raw = line.split()
        names = []
        j = 0
        while j < len(raw):
            tok = raw[j]
            if tok.endswith("%") and j + 1 < len(raw) and raw[j + 1].startswith("percentile"):
                names.append("p" + tok[:-1])
                j += 2
                continue
            if tok == "BW" and j + 1 < len(raw):
                names.append("BW " + raw[j + 1])
                j += 2
                continue
            names.append(tok)
            j += 1
        for data in lines[i + 1:]:
            vals = data.split()
            if not vals or not re.match(r"^\d", vals[0]):
                continue
            out = {}
            for name, val in zip(names, vals):
                try:
                    out[name] = float(val)
                except ValueError:
                    pass
            # perftest prints inf/nan when its timer failed (seen under
            # TCG): a failed run, not a figure (and not valid JSON).
            if not all(math.isfinite(v) for v in out.values()):
                raise ValueError(f"perftest printed non-finite figures in {path}")
            return out
    raise ValueError(f"no result table in {path}")


def pick(fig, *prefixes):
    for p in prefixes:
        for k, v in fig.items():
            if k.startswith(p):
                return v
    raise KeyError(f"none of {prefixes} in {sorted(fig)}")


def pinpoll_figures(path):
    with open(path) as f:
        doc = json.load(f)
    if "results" not in doc:  # filexfer's own record
        return {"gbps": doc["bytes"] * 8 / doc["seconds"] / 1e9}
    p = doc["results"][0]
    out = {"doorbells_per_op": p["work_requests"]["per_op"], "inline": p["inline"]}
    if p.get("latency"):
        lat = p["latency"]
        out.update({k: lat[k] for k in ("min", "p50", "mean", "p99", "p99_9", "p99_99", "max")})
    if p.get("bandwidth"):
        out.update({k: p["bandwidth"][k] for k in ("gbps", "mpps", "mib_per_sec")})
    return out


def main():
    results, run_dir, elapsed, rounds, filexfer = sys.argv[1:6]
    runs = {}
    errors = []
    with open(results) as f:
        for line in f:
            name, tool, path = line.rstrip("\n").split("\t")
            try:
                if tool in ("pinpoll", "rcopy"):
                    fig = pinpoll_figures(path)
                elif tool == "perftest":
                    fig = perftest_figures(path)
                else:
                    why = ""
                    try:
                        with open(path, errors="replace") as f:
                            why = " ".join(f.read().split()[-30:])
                    except OSError:
                        pass
                    errors.append(f"{name}: a run failed ({os.path.basename(path)}: {why[:200]})")
                    continue
            except (OSError, ValueError, KeyError) as e:
                errors.append(f"{name} {tool}: {e}")
                continue
            runs.setdefault(name, {}).setdefault(tool, []).append(fig)

    def med(name, tool, *keys):
        figs = runs.get(name, {}).get(tool, [])
        vals = []
        for fig in figs:
            try:
                vals.append(pick(fig, *keys))
            except KeyError:
                pass
        return statistics.median(vals) if vals else None

    rows = []  # (test, size, metric, ours, theirs, ratio, target_text, ok)

    def row(test, size, metric, ours, theirs, target=None, higher_is_better=False, note=""):
        ratio = ours / theirs if ours is not None and theirs else None
        ok = None
        text = "-"
        if target is not None and ratio is not None:
            ok = ratio >= target if higher_is_better else ratio <= target
            text = ("≥ " if higher_is_better else "≤ ") + f"{target:.2f}×"
        rows.append((test, size, metric, ours, theirs, ratio, text, ok, note))

    lat = [
        ("write-lat-8", "write-lat", "8 B", 0.9),
        ("send-lat-8", "send-lat", "8 B", 0.9),
        ("read-lat-8", "read-lat", "8 B", 1.0),
        ("write-lat-4k", "write-lat", "4 KiB", 0.9),
    ]
    for name, test, size, target in lat:
        half = "½ RTT" if test != "read-lat" else "RTT"
        row(test, size, f"p50 vs typical, µs ({half})",
            med(name, "pinpoll", "p50"), med(name, "perftest", "t_typical"), target)
        row(test, size, f"p99.9, µs ({half})",
            med(name, "pinpoll", "p99_9"), med(name, "perftest", "p99.9"), 1.0)

    # Engine mode against direct mode, same run.
    row("read-lat engine/direct", "8 B", "p50, µs (RTT)",
        med("engine-read-lat-8", "pinpoll", "p50"), med("read-lat-8", "pinpoll", "p50"), 1.05,
        note="ratio is engine/direct")
    row("write-lat engine/direct", "8 B", "p50, µs (½ RTT)",
        med("engine-write-lat-8", "pinpoll", "p50"), med("write-lat-8", "pinpoll", "p50"), 1.05,
        note="ratio is engine/direct; 3 busy threads on 2 vCPUs")

    d = med("write-bw-64", "perftest", "MsgRate")
    l32 = med("write-bw-64-l32", "perftest", "MsgRate")
    best = max([v for v in (d, l32) if v is not None], default=None)
    which = "defaults" if best is not None and best == d else "-l 32 -Q 32"
    row("write-bw", "64 B", "Mpps", med("write-bw-64", "pinpoll", "mpps"), best, 1.2, True,
        note=f"perftest best: {which} (defaults {d}, -l 32 -Q 32 {l32})")
    for name, test, size, nbytes, target in [
        ("write-bw-64k", "write-bw", "64 KiB", 65536, 1.0),
        ("write-bw-1m", "write-bw", "1 MiB", 1 << 20, 1.0),
        ("send-bw-64k", "send-bw", "64 KiB", 65536, None),
        ("read-bw-64k", "read-bw", "64 KiB", 65536, None),
    ]:
        # perftest prints Gb/s with two decimals; its message rate (six
        # decimals) gives the same figure more precisely.
        mpps = med(name, "perftest", "MsgRate")
        theirs = mpps * nbytes * 8 / 1e3 if mpps else med(name, "perftest", "BW average")
        row(test, size, "Gb/s", med(name, "pinpoll", "gbps"), theirs, target, True)
    if filexfer == "yes":
        row("filexfer", "64 MiB file", "Gb/s vs ib_write_bw 1 MiB",
            med("filexfer", "pinpoll", "gbps"), med("filexfer", "perftest", "BW average"), 0.65, True)
        row("filexfer", "64 MiB file", "Gb/s vs rcopy",
            med("filexfer", "pinpoll", "gbps"), med("filexfer", "rcopy", "gbps"), 1.0, True,
            note="rcopy verifies and fsyncs nothing; filexfer's time runs to verified, fsynced, in place")

    def fmt(v):
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1 else f"{v:.2f}"
        return str(v)

    print()
    print(f"pinpoll-perf vs perftest on {os.environ.get('PINPOLL_DEVICE', '?')} "
          f"(medians of {rounds} interleaved rounds, {elapsed} s)")
    print()
    print("| test | size | metric | pinpoll | perftest | pinpoll/perftest | target | met |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for test, size, metric, ours, theirs, ratio, target, ok, note in rows:
        met = "-" if ok is None else ("yes" if ok else "**no**")
        ratio_s = "n/a" if ratio is None else f"{ratio:.2f}×"
        theirs_s = fmt(theirs)
        if "engine/direct" in test:
            theirs_s += " (direct)"
        print(f"| {test} | {size} | {metric} | {fmt(ours)} | {theirs_s} | {ratio_s} | {target} | {met} |")
    if filexfer != "yes":
        print("| filexfer | 64 MiB file | Gb/s vs ib_write_bw 1 MiB | n/a (filexfer not built) | - | - | - | - |")
    notes = [r for r in rows if r[8]]
    if notes:
        print()
        for r in notes:
            print(f"- {r[0]} {r[1]}: {r[8]}")
    if errors:
        print()
        for e in errors:
            print(f"- failed: {e}")

    # The sweep, for the plot.
    sweep = {"write_lat": [], "write_bw": []}
    for name in sorted(runs, key=lambda n: int(n.rsplit("-", 1)[1]) if n.startswith("sweep-") else 0):
        if not name.startswith("sweep-"):
            continue
        size = int(name.rsplit("-", 1)[1])
        if name.startswith("sweep-write-lat-"):
            sweep["write_lat"].append({
                "bytes": size,
                "pinpoll": {k: med(name, "pinpoll", k) for k in ("p50", "p99", "p99_9")},
                "perftest": {"p50": med(name, "perftest", "t_typical"),
                             "p99": med(name, "perftest", "p99"),
                             "p99_9": med(name, "perftest", "p99.9")},
            })
        else:
            sweep["write_bw"].append({
                "bytes": size,
                "pinpoll": med(name, "pinpoll", "gbps"),
                "perftest": med(name, "perftest", "BW average"),
            })
    summary = {
        "rounds": int(rounds),
        "elapsed_seconds": elapsed,
        "rows": [dict(zip(("test", "size", "metric", "pinpoll", "perftest", "ratio", "target", "met", "note"), r))
                 for r in rows],
        "sweep": sweep,
        "runs": runs,
        "errors": errors,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    judged = [r for r in rows if r[7] is not None]
    met = [r for r in judged if r[7]]
    missed = [f"{r[0]} {r[1]} {r[2].split(',')[0]} ({r[5]:.2f}×)" for r in judged if not r[7]]
    print()
    print(f"(raw outputs and summary.json in {run_dir})")
    if errors:
        verdict = (f"verdict: {len(met)} of {len(judged)} targets met; {len(errors)} run(s) failed"
                   + ("; missed: " + "; ".join(missed) if missed else ""))
    elif not missed:
        verdict = f"verdict: all {len(judged)} targets met"
    else:
        verdict = f"verdict: {len(met)} of {len(judged)} targets met; missed: " + "; ".join(missed)
    print(verdict)


if __name__ == "__main__":
    main()
