#!/usr/bin/env python3
"""Latency-throughput plot of perf/load.py runs: p50 and p99 against the offered rate.

Reads steps.json files (rate steps of perf/load.py; each carries its target's label and kind) and
writes one PNG with a panel per kind (json, stream): one colour per target, p50 solid, p99 dashed,
latency on a log scale. Needs matplotlib (perf/compare.sh installs it when missing).
"""
import argparse
import json
import sys


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", nargs="+", help="steps.json files written by perf/load.py")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--title", default="latency against offered rate (open loop)")
    args = p.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    runs = []
    for path in args.steps:
        with open(path) as f:
            runs.append(json.load(f))
    kinds = [k for k in ("json", "stream") if any(r["kind"] == k for r in runs)]
    labels = []
    for r in runs:
        for s in r["steps"]:
            if s["label"] not in labels:
                labels.append(s["label"])
    colours = dict(zip(labels, plt.rcParams["axes.prop_cycle"].by_key()["color"]))

    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for r in runs:
            steps = [s for s in r["steps"] if s["kind"] == kind and s["offered_rps"] is not None]
            if not steps:
                continue
            label = steps[0]["label"]
            x = [s["offered_rps"] for s in steps]
            for q, style in (("p50", "-"), ("p99", "--")):
                y = [s[f"{q}_ms"] for s in steps]
                ax.plot(x, y, style, marker="o", color=colours[label], label=f"{label} {q}")
            # Mark steps that did not keep up (achieved < 95 % of offered) or had errors.
            for s in steps:
                if s["achieved_rps"] < 0.95 * s["offered_rps"] or s["errors"]:
                    ax.plot(s["offered_rps"], s["p99_ms"], "x", color="black", markersize=9)
        ax.set_yscale("log")
        ax.set_xlabel("offered rate, requests/s")
        ax.set_ylabel("latency, ms (log)")
        ax.set_title(f"{kind}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(args.title + "\nx: the step fell behind (achieved < 95 % of offered) or had errors",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"[plot] written {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
