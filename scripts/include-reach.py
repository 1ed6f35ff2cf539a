#!/usr/bin/python3
"""The include graph of the tracked C++/CUDA sources, and two questions about it.

    include-reach.py [--root DIR] reach HEADER...   how many source files include HEADER,
                                                     directly or through other headers
    include-reach.py [--root DIR] family-includes    files under src/ that include a header
                                                     of a compressor family's folder

The graph: every tracked .cc/.h/.cu/.cuh file (git ls-files), its `#include "..."` lines
resolved as the build resolves them: the including file's own folder first, then the
project's include roots (include/, src/, the top, base/, tests/, as CMakeLists.txt and
cmake/GradcommHelpers.cmake set them). An include that resolves to no tracked file (a
generated header, a system header in quotes) is left out. A file "reaches" HEADER when
HEADER is in the transitive closure of its includes; the figure is over all the graph's
files (tests, benchmarks and tools included), and HEADER itself does not count.

A family's folder is a folder directly under compressors/ other than the shapes' shared
folders (issue 45): dense/ (what every dense codec family shares), sparse/ (every
sparsifier's payload, magnitude selection and GPU workspace) and lowrank/ (the low-rank
step's arithmetic). So: topk/, quantize/, powersgd/, ...

Exit status 0; 2 on usage errors (an unknown header).
"""
import argparse
import os
import re
import subprocess
import sys

SOURCE = re.compile(r"\.(cc|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
ROOTS = ["include", "src", ".", "base", "tests"]
SHARED_FOLDERS = {"dense", "sparse", "lowrank"}


def tracked_sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True, text=True).stdout
    return sorted(f for f in out.splitlines() if SOURCE.search(f))


def include_graph(root, files):
    known = set(files)
    graph = {}
    for f in files:
        try:
            with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        edges = set()
        for name in INCLUDE.findall(text):
            for base in [os.path.dirname(f)] + ROOTS:
                candidate = os.path.normpath(os.path.join(base, name))
                if candidate in known:
                    edges.add(candidate)
                    break
        graph[f] = edges
    return graph


def closure(graph, start):
    seen, stack = set(), list(graph.get(start, ()))
    while stack:
        f = stack.pop()
        if f in seen:
            continue
        seen.add(f)
        stack.extend(graph.get(f, ()))
    return seen


def family_folder(path):
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == "compressors" and parts[1] not in SHARED_FOLDERS:
        return parts[1]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sub = parser.add_subparsers(dest="command", required=True)
    reach = sub.add_parser("reach")
    reach.add_argument("headers", nargs="+")
    sub.add_parser("family-includes")
    args = parser.parse_args()

    files = tracked_sources(args.root)
    graph = include_graph(args.root, files)
    total = len(graph)
    if args.command == "reach":
        for header in args.headers:
            if header not in graph:
                print(f"include-reach: {header} is not a tracked source file", file=sys.stderr)
                return 2
            reached = [f for f in graph if f != header and header in closure(graph, f)]
            print(f"{header}: reached by {len(reached)} of {total} files ({100.0 * len(reached) / total:.1f} %)")
        return 0
    hits = []
    for f in sorted(graph):
        if not f.startswith("src/"):
            continue
        for target in sorted(graph[f]):
            if family_folder(target):
                hits.append(f"{f} -> {target}")
    for h in hits:
        print(h)
    print(f"src/ includes of a family folder: {len(hits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
