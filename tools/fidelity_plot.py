#!/usr/bin/env python3
"""Plot `eaglegen fidelity --json` output: per-layer relative error of the residual stream
per setting, one panel per JSON file, as an SVG (plain Python, no plotting library).

usage: fidelity_plot.py OUT.svg [TITLE=]FIDELITY.json ...

Each panel: x = decoder layer, y = relative error against the reference (log scale);
solid line and dots = median over tokens, dashed line = worst token.
"""
import json
import math
import sys

COLORS = {"kv=bf16": "#1f77b4", "kv=fp8": "#d62728", "kv=fp8-token": "#ff7f0e",
          "act=hilo": "#2ca02c", "act=bf16": "#9467bd"}
PW, PH, ML, MR, MT, MB = 300, 230, 58, 12, 34, 42  # panel size and margins


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(out, x0, title, fid, lo, hi):
    w, h = PW - ML - MR, PH - MT - MB
    layers = max(len(s["layers"]) for s in fid["settings"])
    def X(l):
        return x0 + ML + (w * l / (layers - 1) if layers > 1 else w / 2)
    def Y(v):
        v = min(max(v, 10 ** lo), 10 ** hi)
        return MT + h * (hi - math.log10(v)) / (hi - lo)
    out.append(f'<rect x="{x0 + ML}" y="{MT}" width="{w}" height="{h}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{x0 + ML + w / 2}" y="{MT - 12}" text-anchor="middle" font-size="13">{esc(title)}</text>')
    for e in range(lo, hi + 1):
        y = Y(10 ** e)
        out.append(f'<line x1="{x0 + ML}" y1="{y:.1f}" x2="{x0 + ML + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + ML - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">1e{e}</text>')
    for l in range(layers):
        out.append(f'<text x="{X(l):.1f}" y="{MT + h + 14}" text-anchor="middle" font-size="10">{l}</text>')
    out.append(f'<text x="{x0 + ML + w / 2}" y="{MT + h + 30}" text-anchor="middle" font-size="11">'
               f'output of decoder layer</text>')
    for s in fid["settings"]:
        c = COLORS.get(s["name"], "#333")
        for key, dash in (("rel_worst", ' stroke-dasharray="4 3"'), ("rel_median", "")):
            pts = " ".join(f"{X(e['layer']):.1f},{Y(e[key]):.1f}" for e in s["layers"])
            out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.6"{dash}/>')
        for e in s["layers"]:
            out.append(f'<circle cx="{X(e["layer"]):.1f}" cy="{Y(e["rel_median"]):.1f}" r="2.5" fill="{c}"/>')


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    panels = []
    for arg in sys.argv[2:]:
        title, path = arg.split("=", 1) if "=" in arg else ("", arg)
        fid = json.load(open(path))
        panels.append((title or path, fid))
    vals = [e[k] for _, f in panels for s in f["settings"] for e in s["layers"] for k in ("rel_worst", "rel_median")
            if e[k] > 0]
    lo = math.floor(math.log10(min(vals))) if vals else -8
    hi = math.ceil(math.log10(max(vals))) if vals else 0
    names = []
    for _, f in panels:
        for s in f["settings"]:
            if s["name"] not in names:
                names.append(s["name"])
    W, H = PW * len(panels), PH + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    out.append(f'<text x="14" y="{MT + (PH - MT - MB) / 2}" font-size="11" transform="rotate(-90 14 '
               f'{MT + (PH - MT - MB) / 2})" text-anchor="middle">relative error vs {esc(panels[0][1]["reference"])}</text>')
    for i, (title, fid) in enumerate(panels):
        panel(out, i * PW, title, fid, lo, hi)
    x = ML
    for n in names:
        c = COLORS.get(n, "#333")
        out.append(f'<line x1="{x}" y1="{PH + 18}" x2="{x + 22}" y2="{PH + 18}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{x + 27}" y="{PH + 22}" font-size="11">{esc(n)}</text>')
        x += 40 + 7 * len(n)
    out.append(f'<text x="{x + 10}" y="{PH + 22}" font-size="11" fill="#555">solid: median over tokens; '
               f'dashed: worst token</text>')
    out.append("</svg>")
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
