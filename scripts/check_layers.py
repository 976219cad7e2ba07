#!/usr/bin/env python3
"""The include/link check of the test command: every `#include "server/..."` in a target's files is of a
header whose library the target links (itself, or through its link closure), and every direct link
edge between the project's libraries is used by an include. So the CMake libraries and their edges
say exactly what the code does, and a layer cannot lean on another without CMakeLists.txt saying so.

What it reads:
  - CMake's own file API (codemodel v2) of a build folder: each target's sources;
  - CMake's --graphviz output: the targets each target links directly;
  - the includes of each target's sources, and of the headers beside them.
A header belongs to the target that compiles the .cc of the same name; a header with no .cc
(request.h, sync.h, ...) to the one target that compiles sources in its folder.

Two more rules, read from the tree alone:
  - the directions between the server's parts (PARTS): a file includes headers of its own part and of the
    parts on levels below its own, never of one above or beside it;
  - no import cycle among the Python modules of model_store/qvi, client/python and bench/ (imports inside
    functions count: a cycle put off to run time is still one).

Usage: scripts/check_layers.py [BUILD_DIR]   (default build/; it is reconfigured once with the query)
Exit 0 when the includes and the links agree and both rules hold, 1 with each disagreement listed.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:server|tests/cpp|client)/[^"]+)"', re.M)
# The project's libraries, whose direct link edges must each be used by an include (qvi_proto's
# generated headers are not under server/, so its edges are not checked that way).
PROJECT_LIB = re.compile(r"^qvi_")
# Libraries of generated code (proto/), whose headers are not under server/.
GENERATED = {"qvi_proto", "qvi_otlp_proto"}


def codemodel(build: Path) -> dict:
    query = build / ".cmake/api/v1/query/codemodel-v2"
    if not query.exists():
        query.parent.mkdir(parents=True, exist_ok=True)
        query.touch()
    reply = build / ".cmake/api/v1/reply"
    if not reply.exists() or not list(reply.glob("codemodel-v2-*.json")):
        subprocess.run(["cmake", str(build)], check=True, stdout=subprocess.DEVNULL)
    index = max(reply.glob("index-*.json"))
    model_file = json.loads(index.read_text())["reply"]["codemodel-v2"]["jsonFile"]
    model = json.loads((reply / model_file).read_text())
    targets = {}
    for t in model["configurations"][0]["targets"]:
        detail = json.loads((reply / t["jsonFile"]).read_text())
        targets[detail["id"]] = detail
    return targets


def direct_links(build: Path) -> dict[str, set[str]]:
    """Each target's direct link edges, from CMake's --graphviz output ("// A -> B" comments)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["cmake", f"--graphviz={tmp}/g.dot", str(build)], check=True, cwd=tmp,
                       stdout=subprocess.DEVNULL)
        text = Path(tmp, "g.dot").read_text()
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b in re.findall(r"// (\S+) -> (\S+)$", text, re.M):
        if a != b:
            edges[a].add(b)
    return edges


# Includes that are right without a link edge: the CUDA graph plugin is loaded at run time by the
# server and implements the interface of graphs.h; it must not link the model library it serves.
ALLOWED = {("qvi_cuda_graphs", "server/core/model/graphs.h")}


def target_sources(targets: dict) -> dict[str, set[str]]:
    """Each target's source files, as paths from the root (generated code under the build folder left out)."""
    sources: dict[str, set[str]] = {}
    for t in targets.values():
        srcs = set()
        for s in t.get("sources", []):
            p = Path(s["path"])
            p = p if p.is_absolute() else ROOT / p
            try:
                srcs.add(str(p.resolve().relative_to(ROOT)))
            except ValueError:
                continue  # generated code under the build folder
        sources[t["name"]] = srcs
    return sources


class Owners:
    """Who owns a header: the library compiling its .cc, else the one library compiling in its folder."""

    def __init__(self, sources: dict[str, set[str]]):
        self.by_cc: dict[str, str] = {}
        self.by_dir: dict[str, set[str]] = defaultdict(set)
        for lib, srcs in sources.items():
            for s in srcs:
                if s.endswith(".cc"):
                    self.by_cc[s] = lib
                    self.by_dir[str(Path(s).parent)].add(lib)

    def __call__(self, header: str) -> str | None:
        cc = header[: -len(".h")] + ".cc"
        if cc in self.by_cc:
            return self.by_cc[cc]
        libs = self.by_dir.get(str(Path(header).parent), set())
        return next(iter(libs)) if len(libs) == 1 else None


def closure(deps: dict[str, set[str]], name: str) -> set[str]:
    """Every target `name` links, directly or through others."""
    seen, todo = set(), [name]
    while todo:
        for d in deps.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def includes_of(path: str) -> list[str]:
    f = ROOT / path
    return INCLUDE.findall(f.read_text(errors="replace")) if f.exists() else []


def include_problems(sources, deps, owner, used_edges) -> list[str]:
    """Each include of server/ whose owner the including target does not link; fills used_edges."""
    problems = []
    for name, srcs in sorted(sources.items()):
        files = set(srcs)
        # A target's headers are its files too (a header-only include is still an edge).
        files.update(h for h in _headers_near(srcs) if owner(h) == name)
        reach = closure(deps, name)
        for f in sorted(files):
            for inc in includes_of(f):
                if not inc.startswith("server/"):
                    continue
                lib = owner(inc)
                if lib is None:
                    problems.append(f"{f}: includes {inc}, which no single target owns (give it a .cc or a folder of its own)")
                    continue
                if lib == name or (name, inc) in ALLOWED:
                    continue
                if lib not in reach:
                    problems.append(f"{f} ({name}): includes {inc} of {lib}, which {name} does not link")
                used_edges[name].add(lib)
    return problems


def unused_link_problems(libraries, deps, used_edges) -> list[str]:
    """Direct edges between the project's libraries that no include uses."""
    problems = []
    for name in sorted(libraries):
        if not PROJECT_LIB.match(name):
            continue
        for d in sorted(deps[name]):
            if d in libraries and PROJECT_LIB.match(d) and d not in used_edges[name] and d not in GENERATED:
                problems.append(f"{name} links {d}, but none of its files includes a header of {d}")
    return problems


def main() -> int:
    build = (Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build").resolve()
    if not (build / "CMakeCache.txt").exists():
        print(f"check_layers: {build} is not a configured build folder (scripts/setup.sh makes build/)")
        return 2
    targets = codemodel(build)
    sources = target_sources(targets)
    links = direct_links(build)
    deps = {name: {d for d in links.get(name, ()) if d in sources} for name in sources}
    libraries = {t["name"] for t in targets.values()
                 if t["type"] in ("STATIC_LIBRARY", "SHARED_LIBRARY", "OBJECT_LIBRARY")}
    used_edges: dict[str, set[str]] = defaultdict(set)
    problems = include_problems(sources, deps, Owners(sources), used_edges)
    problems += heavy_torch_includes()
    problems += direction_problems(ROOT)
    problems += import_cycle_problems(ROOT)
    problems += unused_link_problems(libraries, deps, used_edges)
    if problems:
        print("check_layers: the includes and the CMake link edges disagree:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"check_layers: {len(sources)} targets, every include of server/ is of a linked library "
          f"and every link between the project's libraries is used, "
          f"no header (and no server source) includes torch's umbrella headers, "
          f"every include goes down the parts' levels, no Python import cycle")
    return 0


# torch's umbrella headers cost a translation unit 13-34 s of compiling each (torch/torch.h 34 s,
# torch/script.h 22, torch/types.h 18, ATen/ATen.h 13; ATen/core/Tensor.h 3): in a header they reach
# every file that includes it, in every build (host, ASan, TSan, clang, the images). Headers declare
# with ATen/core/Tensor.h and c10/core/*.h. The server's sources, compiled in every one of those builds,
# include the operators they call (ATen/ops/zeros.h, ATen/TensorOperators.h, ...), not torch/types.h or
# ATen/ATen.h (model_runner.cc: 18 s with torch/types.h, 11 without, -O2 -g1); torch/script.h only
# where TorchScript is loaded. Tests and benchmarks, compiled once, may include torch/types.h;
# torch/torch.h (the training API) is never needed.
HEAVY_TORCH = re.compile(r'^\s*#\s*include\s+<(torch/torch\.h|torch/script\.h|torch/types\.h|ATen/ATen\.h)>', re.M)
SERVER_SOURCE_ALLOWED = {"torch/script.h"}


def heavy_torch_includes() -> list[str]:
    problems = []
    for folder in ("server", "tests/cpp", "bench", "fuzz"):
        for f in sorted((ROOT / folder).rglob("*")):
            if f.suffix not in (".h", ".cc"):
                continue
            for header in HEAVY_TORCH.findall(f.read_text(errors="replace")):
                if f.suffix == ".h" or header == "torch/torch.h":
                    where = "a header" if f.suffix == ".h" else "a source"
                    problems.append(f"{f.relative_to(ROOT)}: includes <{header}> in {where}; declare with "
                                    "<ATen/core/Tensor.h> and include the ATen/ops/*.h headers a .cc calls")
                elif folder == "server" and header not in SERVER_SOURCE_ALLOWED:
                    problems.append(f"{f.relative_to(ROOT)}: includes <{header}>, which every server build "
                                    "compiles; include <ATen/core/Tensor.h> and the ATen/ops/*.h headers of the "
                                    "operators it calls (at::zeros: <ATen/ops/zeros.h>; +, *: "
                                    "<ATen/TensorOperators.h>)")
    return problems


# The server's parts, from the bottom up: (level, part, path prefixes; the longest prefix that matches a
# file names its part). A file includes headers of its own part and of parts on lower levels: an include
# up or sideways (auth and tls, grpc and http) fails. A new folder joins a part here, or the check fails.
PARTS = (
    (0, "base", ("server/core/base/", "server/core/alloc/", "server/logging.")),
    (1, "sched", ("server/core/sched/",)),
    (1, "text", ("server/core/text/",)),
    (2, "manifest", ("server/core/manifest/",)),
    (3, "store", ("server/core/store/",)),
    (3, "outputs", ("server/core/outputs/",)),
    (4, "request", ("server/core/request/",)),
    (5, "model", ("server/core/model/",)),
    (6, "runner", ("server/core/runner/",)),
    (7, "repository", ("server/core/repository/",)),
    (8, "serving", ("server/core/serving/",)),
    (9, "auth", ("server/auth/",)),
    (9, "tls", ("server/tls/",)),
    (9, "metrics", ("server/metrics/",)),
    (9, "tracing", ("server/tracing/",)),
    (9, "cuda", ("server/cuda/",)),
    (10, "frontend", ("server/frontend/",)),
    (11, "grpc", ("server/grpc/",)),
    (11, "http", ("server/http/",)),
    (12, "server", ("server/main.", "server/server")),  # main.cc, server.cc, its options: the parts put together
)
SERVER_INCLUDE = re.compile(r'^\s*#\s*include\s+"(server/[^"]+)"', re.M)


def part_of(path: str, parts=PARTS) -> tuple[int, str] | None:
    """(level, part) of a path under server/, by its longest matching prefix; None if no part holds it."""
    best = None
    for level, part, prefixes in parts:
        for prefix in prefixes:
            if path.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), level, part)
    return None if best is None else best[1:]


def direction_problems(root: Path, parts=PARTS) -> list[str]:
    """Each include of a file under root/server that goes up or sideways between parts."""
    problems = []
    for f in sorted((root / "server").rglob("*")):
        if f.suffix not in (".h", ".cc"):
            continue
        path = str(f.relative_to(root))
        here = part_of(path, parts)
        if here is None:
            problems.append(f"{path}: in no part of scripts/check_layers.py's PARTS (add its folder to one)")
            continue
        for inc in SERVER_INCLUDE.findall(f.read_text(errors="replace")):
            there = part_of(inc, parts)
            if there is None or there[1] == here[1] or there[0] < here[0]:
                continue
            way = "up" if there[0] > here[0] else "sideways"
            problems.append(f"{path} (part {here[1]}, level {here[0]}) includes {inc} (part {there[1]}, level "
                            f"{there[0]}): an include {way}; a part includes only parts on lower levels (PARTS)")
    return problems


# The Python packages whose modules must not import each other in a circle: (folder, package name; "" for
# a folder of top-level modules).
PYTHON_PACKAGES = (("model_store/qvi", "qvi"), ("client/python/src/qvi_client", "qvi_client"), ("bench", ""))


def python_modules(folder: Path, package: str) -> dict[str, Path]:
    out = {}
    for f in sorted(folder.rglob("*.py")):
        parts = list(f.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(([package] if package else []) + parts)] = f
    return out


def python_imports(f: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that module `name` (file f) imports, anywhere in it."""
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".") if package else []
                base = ".".join(up[:len(up) - (node.level - 1)] + ([base] if base else []))
            out.update(m for m in [base, *(f"{base}.{a.name}" for a in node.names)] if m in known)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = stack[stack.index(v):]
                del stack[stack.index(v):]
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def import_cycle_problems(root: Path, packages=PYTHON_PACKAGES) -> list[str]:
    problems = []
    for folder, package in packages:
        modules = python_modules(root / folder, package)
        graph = {m: python_imports(f, m, modules) for m, f in modules.items()}
        problems += [f"{folder}: the modules {', '.join(c)} import each other in a circle" for c in cycles(graph)]
    return problems


def _headers_near(srcs: set[str]) -> set[str]:
    out = set()
    for s in srcs:
        folder = ROOT / Path(s).parent
        out.update(str(h.relative_to(ROOT)) for h in folder.glob("*.h"))
    return out


if __name__ == "__main__":
    sys.exit(main())
