#!/usr/bin/env python3
"""Draws docs/benchmarks.svg from the summary.json of
`scripts/compare-perftest.sh --sweep`: write latency percentiles against
message size, and write bandwidth against message size, pinpoll against
perftest. Plain SVG, no dependencies.

usage: scripts/plot-benchmarks.py SUMMARY.json [OUT.svg]
"""
import json
import math
import sys

W, H = 1000, 460
PANEL_W, PANEL_H = 400, 330
MARGIN_L, MARGIN_T = 80, 60
GAP = 120
PINPOLL = "#1f77b4"
PERFTEST = "#d62728"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def size_label(b):
    if b >= 1 << 20:
        return f"{b >> 20}M"
    if b >= 1 << 10:
        return f"{b >> 10}K"
    return str(b)


class Panel:
    def __init__(self, x0, title, ylabel, xs, ys):
        self.x0, self.y0 = x0, MARGIN_T
        self.title, self.ylabel = title, ylabel
        xs = [x for x in xs if x]
        ys = [y for y in ys if y and y > 0]
        self.lx = (math.log2(min(xs)), math.log2(max(xs)))
        lo, hi = math.log10(min(ys)), math.log10(max(ys))
        self.ly = (math.floor(lo), math.ceil(hi) if math.ceil(hi) > math.floor(lo) else math.floor(lo) + 1)
        self.out = []

    def px(self, x):
        a, b = self.lx
        return self.x0 + (math.log2(x) - a) / ((b - a) or 1) * PANEL_W

    def py(self, y):
        a, b = self.ly
        return self.y0 + PANEL_H - (math.log10(y) - a) / ((b - a) or 1) * PANEL_H

    def axes(self, sizes):
        o = self.out
        o.append(f'<text x="{self.x0 + PANEL_W / 2}" y="{self.y0 - 20}" text-anchor="middle" '
                 f'font-size="15" font-weight="bold">{esc(self.title)}</text>')
        o.append(f'<rect x="{self.x0}" y="{self.y0}" width="{PANEL_W}" height="{PANEL_H}" '
                 'fill="none" stroke="#333"/>')
        for s in sizes:
            x = self.px(s)
            o.append(f'<line x1="{x:.1f}" y1="{self.y0}" x2="{x:.1f}" y2="{self.y0 + PANEL_H}" stroke="#eee"/>')
            o.append(f'<text x="{x:.1f}" y="{self.y0 + PANEL_H + 16}" text-anchor="middle" '
                     f'font-size="11">{size_label(s)}</text>')
        for e in range(self.ly[0], self.ly[1] + 1):
            for m in (1, 2, 5):
                v = m * 10 ** e
                if not (10 ** self.ly[0] <= v <= 10 ** self.ly[1]):
                    continue
                y = self.py(v)
                o.append(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x0 + PANEL_W}" y2="{y:.1f}" '
                         f'stroke="{"#ddd" if m == 1 else "#f3f3f3"}"/>')
                label = f"{v:g}"
                o.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
        o.append(f'<text x="{self.x0 + PANEL_W / 2}" y="{self.y0 + PANEL_H + 36}" text-anchor="middle" '
                 'font-size="12">message size (bytes)</text>')
        cx, cy = self.x0 - 55, self.y0 + PANEL_H / 2
        o.append(f'<text x="{cx}" y="{cy}" text-anchor="middle" font-size="12" '
                 f'transform="rotate(-90 {cx} {cy})">{esc(self.ylabel)}</text>')

    def line(self, pts, color, dash, width=2, label=None):
        pts = [(x, y) for x, y in pts if y]
        if not pts:
            return
        d = " ".join(f"{'M' if i == 0 else 'L'}{self.px(x):.1f},{self.py(y):.1f}" for i, (x, y) in enumerate(pts))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        self.out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{width}"{dash_attr}/>')
        for x, y in pts:
            self.out.append(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="3" fill="{color}"/>')
        if label:
            x, y = pts[-1]
            self.out.append(f'<text x="{self.px(x) + 6:.1f}" y="{self.py(y) + 4:.1f}" font-size="10" '
                            f'fill="{color}">{esc(label)}</text>')


def main():
    src = sys.argv[1]
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.svg"
    with open(src) as f:
        summary = json.load(f)
    lat = summary["sweep"]["write_lat"]
    bw = summary["sweep"]["write_bw"]
    if not lat or not bw:
        sys.exit("error: no sweep in the summary; run scripts/compare-perftest.sh --sweep")
    lsizes = [p["bytes"] for p in lat]
    lys = [p[t][k] for p in lat for t in ("pinpoll", "perftest") for k in ("p50", "p99", "p99_9")]
    left = Panel(MARGIN_L, "RDMA WRITE latency (½ round trip)", "latency, µs (log)", lsizes, lys)
    left.axes(lsizes)
    styles = {"p50": ("", 2.5), "p99": ("6,3", 1.5), "p99_9": ("2,3", 1.5)}
    names = {"p50": "p50", "p99": "p99", "p99_9": "p99.9"}
    for k, (dash, width) in styles.items():
        left.line([(p["bytes"], p["pinpoll"][k]) for p in lat], PINPOLL, dash, width, f"{names[k]}")
        left.line([(p["bytes"], p["perftest"][k]) for p in lat], PERFTEST, dash, width)
    bsizes = [p["bytes"] for p in bw]
    bys = [p[t] for p in bw for t in ("pinpoll", "perftest")]
    right = Panel(MARGIN_L + PANEL_W + GAP, "RDMA WRITE bandwidth", "Gb/s (log)", bsizes, bys)
    right.axes(bsizes)
    right.line([(p["bytes"], p["pinpoll"]) for p in bw], PINPOLL, "", 2.5)
    right.line([(p["bytes"], p["perftest"]) for p in bw], PERFTEST, "", 2.5)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    svg += left.out + right.out
    ly = H - 28
    svg.append(f'<line x1="{MARGIN_L}" y1="{ly}" x2="{MARGIN_L + 30}" y2="{ly}" stroke="{PINPOLL}" stroke-width="3"/>')
    svg.append(f'<text x="{MARGIN_L + 36}" y="{ly + 4}" font-size="12">pinpoll-perf (direct mode, loopback)</text>')
    svg.append(f'<line x1="{MARGIN_L + 290}" y1="{ly}" x2="{MARGIN_L + 320}" y2="{ly}" stroke="{PERFTEST}" stroke-width="3"/>')
    svg.append(f'<text x="{MARGIN_L + 326}" y="{ly + 4}" font-size="12">perftest (ib_write_lat / ib_write_bw)</text>')
    svg.append(f'<text x="{MARGIN_L + 590}" y="{ly + 4}" font-size="11" fill="#555">solid p50 · dashed p99 · dotted p99.9 · '
               f'medians of {summary["rounds"]} rounds, rxe in a TCG guest</text>')
    svg.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
