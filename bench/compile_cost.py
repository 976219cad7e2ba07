#!/usr/bin/env python3
"""What one compiler flag costs: translation units of a build (from its compile_commands.json) compiled
without ccache, once as the build compiles them and once with one flag replaced, N at a time, each variant
timed as the wall time of the whole set and the sum of each unit's time. By default the flag is the level
of debug information: -g (full DWARF) against -g1 (line tables: function names and lines, what
backtraces, perf and sanitizer reports use).

    .venv/bin/python bench/compile_cost.py build [--jobs 2] [--under server/] [--every 3]
    .venv/bin/python bench/compile_cost.py build-address --flag=-O2 --instead=-O1 --every 4

--every K takes every K-th unit (in compile_commands.json's order), for a shorter run. --flag is replaced
wherever the command has it (a unit without it is compiled as it is, both times); --instead may be several
flags, e.g. --flag=-fsanitize=address,undefined --instead="-fsanitize=address,undefined -fno-sanitize=vptr".
"""
import argparse
import json
import os
import shlex
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def command_for(entry, swap, out):
    args = shlex.split(entry["command"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    args = [b for a in args for b in swap.get(a, [a])]
    i = args.index("-o")
    args[i + 1] = out
    return args, entry["directory"]


def run_all(entries, swap, jobs, scratch):
    def one(k):
        args, cwd = command_for(entries[k], swap, os.path.join(scratch, f"{k}.o"))
        t = time.monotonic()
        subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.monotonic() - t
    start = time.monotonic()
    with ThreadPoolExecutor(jobs) as pool:
        each = list(pool.map(one, range(len(entries))))
    return time.monotonic() - start, sum(each)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--under", default="server/")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--flag", default="-g", help="the flag compared (default -g)")
    p.add_argument("--instead", default="-g1", help="what replaces it (default -g1)")
    a = p.parse_args()
    root = os.path.abspath(os.path.join(a.build, ".."))
    entries = [e for e in json.load(open(os.path.join(a.build, "compile_commands.json")))
               if os.path.relpath(e["file"], root).startswith(a.under)][::a.every]
    # Both spellings of the flag are set to the variant's, so that a build that already has --instead
    # is compared too (the -g1 build against -g). --instead may be several flags ("-O1 -fno-inline").
    variants = {a.flag: {a.instead: [a.flag]}, a.instead: {a.flag: a.instead.split()}}
    print(f"{len(entries)} translation units under {a.under} (every {a.every}), {a.jobs} at a time, no ccache")
    with tempfile.TemporaryDirectory() as scratch:
        results = {}
        for name, swap in variants.items():
            wall, cpu = run_all(entries, swap, a.jobs, scratch)
            results[name] = wall
            print(f"  {name:6} wall {wall:7.1f} s   sum of units {cpu:7.1f} s")
    print(f"  {a.instead} takes {results[a.instead] / results[a.flag]:.2f} of {a.flag}'s wall time")


if __name__ == "__main__":
    main()
