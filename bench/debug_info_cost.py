#!/usr/bin/env python3
"""What the level of debug information costs the compiler: every translation unit of server/ (from the
build's compile_commands.json) compiled without ccache, once with -g (full DWARF) and once with -g1 (line
tables: function names and lines, what backtraces, perf and sanitizer reports use), N at a time, each
variant timed as the wall time of the whole set and the sum of each unit's time.

    .venv/bin/python bench/debug_info_cost.py build [--jobs 2] [--under server/] [--every 3]

--every K takes every K-th unit (in compile_commands.json's order), for a shorter run.
"""
import argparse
import json
import os
import shlex
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def command_for(entry, level, out):
    args = shlex.split(entry["command"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    args = [level if a in ("-g", "-g1") else a for a in args]
    i = args.index("-o")
    args[i + 1] = out
    return args, entry["directory"]


def run_all(entries, level, jobs, scratch):
    def one(k):
        args, cwd = command_for(entries[k], level, os.path.join(scratch, f"{k}.o"))
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
    a = p.parse_args()
    root = os.path.abspath(os.path.join(a.build, ".."))
    entries = [e for e in json.load(open(os.path.join(a.build, "compile_commands.json")))
               if os.path.relpath(e["file"], root).startswith(a.under)][::a.every]
    print(f"{len(entries)} translation units under {a.under} (every {a.every}), {a.jobs} at a time, no ccache")
    with tempfile.TemporaryDirectory() as scratch:
        results = {}
        for level in ("-g", "-g1"):
            wall, cpu = run_all(entries, level, a.jobs, scratch)
            results[level] = wall
            print(f"  {level:4} wall {wall:7.1f} s   sum of units {cpu:7.1f} s")
    print(f"  -g1 takes {results['-g1'] / results['-g']:.2f} of -g's wall time")


if __name__ == "__main__":
    main()
