#!/usr/bin/env python3
"""Tests of the comparison tooling's arithmetic on data made here:
compare_table.py (percentiles of raw samples, the warm-up dropped the same
way from both tools, ratios with their per-round spread) and
count_instructions.py (waiting removed the same way for every tool and
object). Run: python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind_profile as cp  # noqa: E402
import compare_table as ct  # noqa: E402
import count_instructions as ci  # noqa: E402


def perftest_output(half_cycles: list[float]) -> str:
    """ib_write_lat -C -U's output: the samples, then its own table."""
    lines = ["#, cycles"] + [f"{i + 1}, {v:g}" for i, v in enumerate(half_cycles)]
    lines += [" #bytes #iterations    t_min[cycles]    t_max[cycles]  t_typical[cycles]"
              "    t_avg[cycles]    t_stdev[cycles]   99% percentile[cycles]   99.9% percentile[cycles] ",
              " 8       1001          1.00           9.00         5.00       5.00        1.00"
              "            9.00                 9.00   "]
    return "\n".join(lines) + "\n"


def pinpoll_output(round_trip_ticks: list[int], half: bool = True) -> dict:
    return {"results": [{
        "work_requests": {"per_op": 1.0}, "inline": False,
        "latency": {"measure": "half_round_trip" if half else "round_trip"},
        "raw_samples": {"unit": "ticks", "ns_per_tick": 0.5, "round_trip_ticks": round_trip_ticks},
    }]}


class CompareTable(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.results = os.path.join(self.dir.name, "results.tsv")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_percentiles_come_from_the_same_samples_of_both_tools(self):
        warmup, samples = 10, 1000
        rows = []
        for r in (1, 2, 3):
            # perftest: warm-up samples huge, then 1..1000 cycles per half
            # round trip (shuffled), and one sample beyond the compared ones.
            measured = [float((i * 7919) % samples + 1) for i in range(samples)]
            theirs = [1e9] * warmup + measured + [1e9]
            rows.append(("write-lat-8", "perftest", r, self.write(f"pt{r}.txt", perftest_output(theirs))))
            # pinpoll: full round trips of r * (1..1000) * 2 ticks: its half
            # round trips are r times perftest's.
            ours = [10**12] * warmup + [int(v * 2 * r) for v in measured]
            rows.append(("write-lat-8", "pinpoll", r,
                         self.write(f"pp{r}.json", json.dumps(pinpoll_output(ours)))))
        with open(self.results, "w") as f:
            for name, tool, r, path in rows:
                f.write(f"{name}\t{tool}\t{r}\t{path}\t{samples}\n")
        runs = ct.read_runs(self.results, warmup, samples)
        self.assertEqual(runs.errors, [])
        # Nearest rank over 1..1000: p50 = 500, p99 = 990, p99.9 = 999.
        self.assertEqual(runs.values("write-lat-8", "perftest", "p50_ticks"), {1: 500, 2: 500, 3: 500})
        self.assertEqual(runs.values("write-lat-8", "pinpoll", "p99_ticks"), {1: 990, 2: 1980, 3: 2970})
        self.assertEqual(runs.values("write-lat-8", "pinpoll", "p99_9_ticks")[3], 2997)
        get = ct.micros(runs, 0.5)
        ours, theirs = get("write-lat-8", "pinpoll", "p50"), get("write-lat-8", "perftest", "p50")
        self.assertAlmostEqual(theirs.median, 0.25)  # 500 ticks of 0.5 ns
        ratio, text = ct.ratio_cell(ours, theirs)
        self.assertAlmostEqual(ratio, 2.0)
        self.assertEqual(text, "2.00× (1.00–3.00)")

    def test_too_few_samples_is_an_error_not_a_figure(self):
        path = self.write("pt.txt", perftest_output([5.0] * 50))
        with open(self.results, "w") as f:
            f.write(f"send-lat-8\tperftest\t1\t{path}\t100\n")
        runs = ct.read_runs(self.results, 10, 100)
        self.assertEqual(runs.values("send-lat-8", "perftest", "p50_ticks"), {})
        self.assertIn("50 samples, fewer than 10 + 100", runs.errors[0])

    def test_samples_in_microseconds_are_refused(self):
        path = self.write("pt.txt", perftest_output([5.0]).replace("#, cycles", "#, usec"))
        with self.assertRaisesRegex(ValueError, "run perftest with -C"):
            ct.perftest_figures(path)


def profile(own_counts: dict, edges: dict, provider_counts: dict | None = None) -> cp.ThreadProfile:
    """A thread profile: instruction counts of the executable and of a
    provider, and the executable's backward jumps."""
    p = cp.ThreadProfile(path="synthetic")
    for obj, counts in (("/bin/tool", own_counts), ("/lib/librxe.so", provider_counts or {})):
        for addr, n in counts.items():
            p.instructions[(obj, addr)] = n
            p.objects[obj] += n
            p.functions[(obj, "f")] += n
    p.back_edges.update({("/bin/tool", src, dst): n for (src, dst), n in edges.items()})
    return p


def tool_runs(work: dict, spin: dict, provider_work: dict, provider_spin: dict, turns: dict) -> dict:
    """n1, n2 and crowded runs of a tool whose loop does `work` per
    operation and `spin` per empty turn (instruction address -> count),
    with `turns[variant]` empty turns in all."""
    ops = {"n1": 100, "n2": 1100, "crowded": 100}
    out = {}
    for v in ops:
        own = collections.Counter()
        prov = collections.Counter()
        for a, n in work.items():
            own[a] += n * ops[v] + 7  # + loop entry, once per run
        for a, n in spin.items():
            own[a] += n * turns[v]
        for a, n in provider_work.items():
            prov[a] += n * ops[v]
        for a, n in provider_spin.items():
            prov[a] += n * turns[v]
        prof = profile(dict(own), {(0x20, 0x10): turns[v]}, dict(prov))
        out[v] = ci.Run("t", "tool", v, ops[v], "/bin/tool", prof)
    return out


class CountInstructions(unittest.TestCase):
    def test_waiting_is_removed_from_every_object_exactly(self):
        # 4 own instructions of work, one of them also the loop's head (it
        # runs once per turn), 3 more per empty turn; the provider's poll
        # runs 2 instructions per call and walks 3 more per call.
        work = {0x10: 1, 0x14: 1, 0x18: 1, 0x20: 1}
        spin = {0x10: 1, 0x1c: 1, 0x20: 1}
        runs = tool_runs(work, spin, {0x100: 2, 0x104: 5}, {0x100: 2, 0x104: 3},
                         {"n1": 5_000, "n2": 61_000, "crowded": 90_000})
        r = ci.analyse(runs)
        self.assertAlmostEqual(r["per_op"]["own"], 4.0)
        self.assertAlmostEqual(r["per_op"]["provider"], 7.0)
        self.assertAlmostEqual(r["per_op"]["user space"], 11.0)
        self.assertAlmostEqual(r["empty_turns_per_op"], 56.0)
        self.assertEqual(r["estimated_per_op"], 0.0)
        # With the waiting: 4 + 3 * 56 own, 7 + 5 * 56 in the provider.
        self.assertAlmostEqual(r["with_waiting_per_op"], 11 + 8 * 56)

    def test_an_instruction_of_two_waits_is_removed_exactly(self):
        # Two wait loops (jumps 0x20 -> 0x10 and 0x48 -> 0x40); the
        # provider's poll runs once per empty turn of the first and twice
        # per empty turn of the second, and once per operation.
        turns_a = {"n1": 48_082, "n2": 378_925, "crowded": 160_075}
        turns_b = {"n1": 134, "n2": 1_168, "crowded": 492}
        ops = {"n1": 300, "n2": 1500, "crowded": 300}
        runs = {}
        for v in ops:
            own = {0x10: turns_a[v] + ops[v], 0x40: turns_b[v] + ops[v], 0x50: 3 * ops[v]}
            poll = {0x100: ops[v] + turns_a[v] + 2 * turns_b[v]}
            prof = profile(own, {(0x20, 0x10): turns_a[v], (0x48, 0x40): turns_b[v]}, poll)
            runs[v] = ci.Run("t", "tool", v, ops[v], "/bin/tool", prof)
        r = ci.analyse(runs)
        self.assertEqual(r["estimated_per_op"], 0.0)
        self.assertAlmostEqual(r["per_op"]["own"], 5.0)
        self.assertAlmostEqual(r["per_op"]["provider"], 1.0)

    def test_a_path_taken_every_few_turns_is_an_estimate_and_shown_as_one(self):
        work = {0x10: 1}
        spin = {0x10: 1, 0x20: 1}
        turns = {"n1": 25_600, "n2": 281_600, "crowded": 51_200}
        runs = tool_runs(work, spin, {}, {}, turns)
        for v, r in runs.items():  # a clock read every 256 empty turns
            r.profile.instructions[("/bin/tool", 0x30)] = turns[v] // 256
            r.profile.objects["/bin/tool"] += turns[v] // 256
        r = ci.analyse(runs)
        self.assertAlmostEqual(r["per_op"]["own"], 1.0)
        self.assertAlmostEqual(r["estimated_per_op"], (281_600 - 25_600) / 256 / 1000)


if __name__ == "__main__":
    unittest.main()
