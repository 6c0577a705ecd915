#!/usr/bin/env python3
"""The table of scripts/compare-perftest.sh: pinpoll-perf against perftest,
like for like, from alternated rounds.

usage: compare_table.py RESULTS.tsv COMMANDS.tsv RUN_DIR ELAPSED_SECONDS ROUNDS
                        WARMUP SAMPLES FILEXFER(yes|no)

RESULTS.tsv: name, tool, round, path and latency samples compared of each
run (tool: perftest, pinpoll, pinpoll-as-perftest, rcopy, or failed). COMMANDS.tsv: name, tool, command
line, what differs. Latency percentiles are computed here, the same way
for both tools, from the raw samples of every run (perftest's -C -U,
pinpoll-perf's --raw-samples) after dropping the first WARMUP of each and
keeping the next ones, as many as the run's line says (SAMPLES in the
table's head: the main points'). Each figure is the median over the rounds with
the range of the rounds beside it; a ratio is the ratio of the medians,
with the range of the per-round ratios (each round's pinpoll run over the
same round's perftest run). Writes RUN_DIR/summary.json and prints
Markdown on stdout; its last line is the verdict.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field

# (quantile, key) of the latency rows.
PERCENTILES = ((0.5, "p50"), (0.99, "p99"), (0.999, "p99_9"))
LABELS = {"p50": "p50", "p99": "p99", "p99_9": "p99.9"}
CONFIGS = {
    "pinpoll-as-perftest": "as perftest (-I 0 --await-sends)",
    "pinpoll": "as meant (profile)",
}
SAMPLE_LINE = re.compile(r"^\s*(\d+),\s*([-+0-9.eE]+)\s*$")


def perftest_table(lines: list[str], path: str) -> dict:
    """perftest's result table, by its column names without their units
    (robust to the spacing and tab mix perftest prints). Figures it could
    not compute (inf, nan) are left out."""
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
                names.append("BW " + raw[j + 1].split("[")[0])
                j += 2
                continue
            names.append(tok.split("[")[0])
            j += 1
        for data in lines[i + 1:]:
            vals = data.split()
            if not vals or not re.match(r"^\d", vals[0]) or SAMPLE_LINE.match(data):
                continue
            out = {}
            for name, val in zip(names, vals):
                try:
                    v = float(val)
                except ValueError:
                    continue
                # -C overflows its standard deviation (-nan); its timer
                # failing under TCG gives inf: not figures (nor JSON).
                if math.isfinite(v):
                    out[name] = v
            return out
    raise ValueError(f"no result table in {path}")


def perftest_samples(lines: list[str], path: str) -> list[float] | None:
    """The samples -U prints after its `#, cycles` line, in order (each
    as perftest reports latency: half a round trip for WRITE and SEND)."""
    for i, line in enumerate(lines):
        if line.strip() == "#, cycles":
            out = []
            for data in lines[i + 1:]:
                m = SAMPLE_LINE.match(data)
                if not m:
                    break
                out.append(float(m.group(2)))
            if not all(math.isfinite(v) and v > 0 for v in out):
                raise ValueError(f"perftest printed a non-positive sample in {path}")
            return out
        if line.strip() == "#, usec":
            raise ValueError(f"{path}: samples in usec: run perftest with -C (cycles)")
    return None


def perftest_figures(path: str) -> dict:
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    fig = perftest_table(lines, path)
    samples = perftest_samples(lines, path)
    if samples is not None:
        fig["samples"] = samples
    elif "MsgRate" not in fig:
        raise ValueError(f"perftest printed neither samples nor a message rate in {path}")
    return fig


def pinpoll_figures(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    if "results" not in doc:  # filexfer's and rcopy's own record
        return {"gbps": doc["bytes"] * 8 / doc["seconds"] / 1e9}
    p = doc["results"][0]
    out = {"doorbells_per_op": p["work_requests"]["per_op"], "inline": p["inline"]}
    raw = p.get("raw_samples")
    if raw:
        # As perftest reports latency: half a round trip for WRITE and SEND.
        half = p["latency"]["measure"] == "half_round_trip"
        out["samples"] = [t / 2 if half else float(t) for t in raw["round_trip_ticks"]]
        out["ns_per_tick"] = raw["ns_per_tick"]
    if p.get("bandwidth"):
        out.update({k: p["bandwidth"][k] for k in ("gbps", "mpps", "mib_per_sec")})
    return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or
    below it."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Runs:
    """Every run's figures, by point, tool and round."""
    warmup: int
    samples: int
    by: dict = field(default_factory=dict)  # name -> tool -> round -> figures
    errors: list = field(default_factory=list)

    def add(self, name: str, tool: str, r: int, fig: dict, samples: int) -> None:
        if "samples" in fig:
            s = fig.pop("samples")
            if not samples or len(s) < self.warmup + samples:
                self.errors.append(f"{name} {tool} round {r}: {len(s)} samples, "
                                   f"fewer than {self.warmup} + {samples}")
                return
            kept = sorted(s[self.warmup:self.warmup + samples])
            for q, key in PERCENTILES:
                fig[key + "_ticks"] = percentile(kept, q)
        self.by.setdefault(name, {}).setdefault(tool, {})[r] = fig

    def values(self, name: str, tool: str, key: str) -> dict:
        """round -> figure."""
        return {r: f[key] for r, f in self.by.get(name, {}).get(tool, {}).items()
                if f.get(key) is not None}


def read_runs(results: str, warmup: int, samples: int) -> Runs:
    runs = Runs(warmup, samples)
    with open(results) as f:
        for line in f:
            name, tool, r, path, samples = line.rstrip("\n").split("\t")
            if tool == "failed":
                why = ""
                try:
                    with open(path, errors="replace") as g:
                        why = " ".join(g.read().split()[-30:])
                except OSError:
                    pass
                runs.errors.append(f"{name} round {r}: a run failed ({os.path.basename(path)}: {why[:200]})")
                continue
            try:
                fig = perftest_figures(path) if tool == "perftest" else pinpoll_figures(path)
            except (OSError, ValueError, KeyError) as e:
                runs.errors.append(f"{name} {tool} round {r}: {e}")
                continue
            runs.add(name, tool, int(r), fig, int(samples))
    return runs


@dataclass
class Figure:
    """A median over rounds, its range, and the per-round values."""
    per_round: dict

    @property
    def median(self) -> float | None:
        return statistics.median(self.per_round.values()) if self.per_round else None

    def text(self, fmt) -> str:
        if not self.per_round:
            return "n/a"
        lo, hi = min(self.per_round.values()), max(self.per_round.values())
        return f"{fmt(self.median)} ({fmt(lo)}–{fmt(hi)})"


def ratio_cell(ours: Figure, theirs: Figure) -> tuple[float | None, str]:
    if ours.median is None or not theirs.median:
        return None, "n/a"
    ratio = ours.median / theirs.median
    rounds = [ours.per_round[r] / theirs.per_round[r]
              for r in ours.per_round if theirs.per_round.get(r)]
    spread = f" ({min(rounds):.2f}–{max(rounds):.2f})" if rounds else ""
    return ratio, f"{ratio:.2f}×{spread}"


def fmt(v: float) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


class Table:
    def __init__(self) -> None:
        self.rows = []  # dicts

    def add(self, test, size, metric, config, ours: Figure, theirs: Figure,
            target=None, higher_is_better=False, their_label=""):
        ratio, ratio_text = ratio_cell(ours, theirs)
        ok, target_text = None, "-"
        if target is not None:
            target_text = ("≥ " if higher_is_better else "≤ ") + f"{target:.2f}×"
            if ratio is not None:
                ok = ratio >= target if higher_is_better else ratio <= target
        self.rows.append(dict(
            test=test, size=size, metric=metric, config=config,
            pinpoll=ours.median, pinpoll_rounds=ours.per_round, pinpoll_text=ours.text(fmt),
            perftest=theirs.median, perftest_rounds=theirs.per_round,
            perftest_text=theirs.text(fmt) + their_label,
            ratio=ratio, ratio_text=ratio_text, target=target_text, met=ok))


LATENCY = (
    ("write-lat-8", "write-lat", "8 B", 0.9),
    ("send-lat-8", "send-lat", "8 B", 0.9),
    ("read-lat-8", "read-lat", "8 B", 1.0),
    ("write-lat-4k", "write-lat", "4 KiB", 0.9),
)
BANDWIDTH = (
    ("write-bw-64", "write-bw", "64 B", "Mpps", 1.2, "-l 32 -Q 32"),
    ("write-bw-64-l1", "write-bw", "64 B", "Mpps", 1.2, "-l 1 -Q 100"),
    ("write-bw-64k", "write-bw", "64 KiB", "Gb/s", 1.0, "-l 32 -Q 32"),
    ("write-bw-1m", "write-bw", "1 MiB", "Gb/s", 1.0, "-l 32 -Q 32"),
    ("send-bw-64k", "send-bw", "64 KiB", "Gb/s", None, "-l 32 -Q 32"),
    ("read-bw-64k", "read-bw", "64 KiB", "Gb/s", None, "-l 32 -Q 32"),
)
SIZES = {"8 B": 8, "64 B": 64, "4 KiB": 4096, "64 KiB": 65536, "1 MiB": 1 << 20}


def micros(runs: Runs, scale: float):
    """A point's latency percentile, in µs, per round."""
    def get(name: str, tool: str, key: str) -> Figure:
        return Figure({r: v * scale / 1000 for r, v in runs.values(name, tool, key + "_ticks").items()})
    return get


def bandwidth(runs: Runs, name: str, tool: str, unit: str, nbytes: int) -> Figure:
    """Mpps, or Gb/s (perftest's from its message rate: six decimals
    where its Gb/s has two)."""
    if tool == "perftest":
        mpps = runs.values(name, tool, "MsgRate")
        if unit == "Mpps":
            return Figure(mpps)
        return Figure({r: v * nbytes * 8 / 1e3 for r, v in mpps.items()})
    return Figure(runs.values(name, tool, "mpps" if unit == "Mpps" else "gbps"))


def build_rows(runs: Runs, scale: float, filexfer: str) -> Table:
    t = Table()
    lat = micros(runs, scale)
    for name, test, size, target in LATENCY:
        half = "½ RTT" if test != "read-lat" else "RTT"
        for _q, key in PERCENTILES:
            goal = target if key == "p50" else (1.0 if key == "p99_9" else None)
            for tool, config in CONFIGS.items():
                t.add(test, size, f"{LABELS[key]}, µs ({half})", config,
                      lat(name, tool, key), lat(name, "perftest", key), goal)
    for name, direct, test in (("engine-read-lat-8", "read-lat-8", "read-lat"),
                               ("engine-write-lat-8", "write-lat-8", "write-lat")):
        t.add(f"{test} engine/direct", "8 B", "p50, µs", "engine / direct (as meant)",
              lat(name, "pinpoll", "p50"), lat(direct, "pinpoll", "p50"), 1.05,
              their_label=" (direct)")
    for name, test, size, unit, target, knobs in BANDWIDTH:
        t.add(test, size, unit, f"both {knobs} -t 128, no inline",
              bandwidth(runs, name, "pinpoll", unit, SIZES[size]),
              bandwidth(runs, name, "perftest", unit, SIZES[size]), target, True)
    if filexfer == "yes":
        fx = Figure(runs.values("filexfer", "pinpoll", "gbps"))
        t.add("filexfer", "64 MiB file", "Gb/s vs ib_write_bw 1 MiB", "filexfer", fx,
              Figure(runs.values("filexfer", "perftest", "BW average")), 0.65, True)
        t.add("filexfer", "64 MiB file", "Gb/s vs rcopy", "filexfer", fx,
              Figure(runs.values("filexfer", "rcopy", "gbps")), 1.0, True, " (rcopy)")
    return t


def sweep(runs: Runs, scale: float) -> dict:
    """The sweep points, for `pinpoll-tune plot` (pinpoll as perftest)."""
    out = {"write_lat": [], "write_bw": []}
    lat = micros(runs, scale)
    names = sorted((n for n in runs.by if n.startswith("sweep-")), key=lambda n: int(n.rsplit("-", 1)[1]))
    for name in names:
        size = int(name.rsplit("-", 1)[1])
        if name.startswith("sweep-write-lat-"):
            out["write_lat"].append({
                "bytes": size,
                "pinpoll": {k: lat(name, "pinpoll-as-perftest", k).median for _q, k in PERCENTILES},
                "perftest": {k: lat(name, "perftest", k).median for _q, k in PERCENTILES},
            })
        else:
            out["write_bw"].append({
                "bytes": size,
                "pinpoll": bandwidth(runs, name, "pinpoll", "Gb/s", size).median,
                "perftest": bandwidth(runs, name, "perftest", "Gb/s", size).median,
            })
    return out


def read_commands(path: str) -> list[tuple[str, str, str, str]]:
    with open(path) as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]


def markdown(t: Table, commands: list, runs: Runs, head: str) -> list[str]:
    out = ["", head, "",
           "| test | size | metric | pinpoll-perf | pinpoll | perftest | pinpoll/perftest | target | met |",
           "|---|---|---|---|---:|---:|---:|---|---|"]
    for r in t.rows:
        met = "-" if r["met"] is None else ("yes" if r["met"] else "**no**")
        out.append(f"| {r['test']} | {r['size']} | {r['metric']} | {r['config']} | {r['pinpoll_text']} "
                   f"| {r['perftest_text']} | {r['ratio_text']} | {r['target']} | {met} |")
    out += ["", "Command lines (`$DEV`, `$GID`: the guest's rxe0 and the RoCE v2 GID of its IPv4 address):", "",
            "| point | tool | command | differs, and why |", "|---|---|---|---|"]
    for name, tool, cmd, note in commands:
        out.append(f"| {name} | {tool} | `{cmd}` | {note} |")
    if runs.errors:
        out.append("")
        out += [f"- failed: {e}" for e in runs.errors]
    return out


def verdict(t: Table, errors: list) -> str:
    judged = [r for r in t.rows if r["met"] is not None]
    met = [r for r in judged if r["met"]]
    missed = [f"{r['test']} {r['size']} {r['metric'].split(',')[0]} {r['config'].split(' (')[0]} "
              f"({r['ratio']:.2f}×)" for r in judged if not r["met"]]
    text = (f"verdict: all {len(judged)} targets met" if not missed and not errors else
            f"verdict: {len(met)} of {len(judged)} targets met")
    if errors:
        text += f"; {len(errors)} run(s) failed"
    if missed:
        text += "; missed: " + "; ".join(missed)
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 9:
        print(__doc__, file=sys.stderr)
        return 2
    results, commands, run_dir, elapsed, rounds, warmup, samples, filexfer = argv[1:]
    runs = read_runs(results, int(warmup), int(samples))
    # One scale for both tools' ticks (both read the TSC): pinpoll-perf's
    # calibration, the median over its runs. Ratios do not depend on it.
    scales = [f["ns_per_tick"] for tools in runs.by.values() for tool, rs in tools.items()
              if tool.startswith("pinpoll") for f in rs.values() if f.get("ns_per_tick")]
    scale = statistics.median(scales) if scales else float("nan")
    t = build_rows(runs, scale, filexfer)
    head = (f"pinpoll-perf vs perftest on {os.environ.get('PINPOLL_DEVICE', '?')}: medians of "
            f"{rounds} rounds in alternated order (range of the rounds in brackets), latency "
            f"percentiles of {samples} samples per run after {warmup} dropped from each, "
            f"{scale:.4f} ns per TSC tick ({elapsed} s)")
    lines = markdown(t, read_commands(commands), runs, head)
    summary = {
        "rounds": int(rounds), "warmup": int(warmup), "samples": int(samples),
        "ns_per_tick": scale, "elapsed_seconds": int(elapsed),
        "rows": t.rows, "sweep": sweep(runs, scale), "errors": runs.errors,
        "runs": {n: {tool: {str(r): {k: v for k, v in f.items()} for r, f in rs.items()}
                     for tool, rs in tools.items()} for n, tools in runs.by.items()},
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    lines += ["", f"(raw outputs and summary.json in {run_dir})", verdict(t, runs.errors)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
