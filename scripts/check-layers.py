#!/usr/bin/python3
"""Checks that the layers hold at link time, not only for includes.

Each layer (docs/architecture.md, "Layout") is a library: base, cuda, store,
transport, compressors, then the core. For each one this reads the symbols its
objects leave undefined and the ones they define (nm), and asserts that every
undefined gradcomm:: symbol is defined in the same layer or in a layer below it
that it links. A lower layer that calls up links only because the core (or the
test binary) happens to bring the higher layer along; this finds that.

    check-layers.py [--nm NM] [--reverse] [--expect-violations]
                    --layer NAME TARGET FILES LINKS  (bottom-up, one per layer)

  NAME    the layer's name, as printed ("base")
  TARGET  its CMake target ("gradcomm_base")
  FILES   its static library, or for an object library its objects, joined by '|'
          (a CUDA device-link object, cmake_device_link.o, counts as one of them)
  LINKS   what the target links (its LINK_LIBRARIES), joined by '|'; only the
          names of other layers' targets matter

The order of the --layer arguments is the layer order (tests/layering/CMakeLists.txt
declares it once). Two rules, both printed as violations:
  - a layer links (directly or through what it links) only layers below it;
  - every gradcomm:: symbol a layer leaves undefined is defined in that layer or
    in a layer it links (weak definitions, W/V/u, from templates and inline
    functions, count as definitions).
--reverse checks the same libraries with the order turned upside down, and
--expect-violations inverts the verdict (exit 0 only when symbol violations were
found): together they are ctest layers.link_selftest, which shows the check can fail.

Symbols are matched by their mangled names (nm -P): demangled, a function
template's name starts with its return type, so "starts with gradcomm::" would
miss it. They are demangled (c++filt) only to be printed. Exit status: 0 clean,
1 violations, 2 usage or tool errors.
"""
import argparse
import re
import subprocess
import sys

# A mangled name in namespace gradcomm: a nested name (N ... 8gradcomm), possibly
# const/volatile/ref-qualified (K V r R O), behind a special-name prefix (vtable TV,
# typeinfo TI, typeinfo name TS, VTT TT, guard variable GV, thunks Th/Tv/Tc) and,
# for an entity local to a function (a static of an inline function), a Z.
GRADCOMM_SYMBOL = re.compile(r"^_Z(?:T[VIST]|GV|Thn?\d+_|Tvn?\d+_n?\d+_|Tc\w+?_)*Z?N[rVKRO]*8gradcomm")
# nm types of symbols defined with global or weak binding (lowercase letters other
# than these are local and cannot satisfy another object's reference).
GLOBAL_DEFINED = set("ABCDGIRSTVWiuvw")


def nm_symbols(nm, files, defined):
    """Mangled gradcomm:: symbols that `files` define (global or weak) or leave undefined."""
    flag = "--defined-only" if defined else "--undefined-only"
    try:
        out = subprocess.run([nm, "-P", flag, *files], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"check-layers: {nm} failed on {' '.join(files)}: {getattr(e, 'stderr', '') or e}")
    symbols = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2 or line.endswith(":"):  # "lib.a[member.o]:" headers
            continue
        name, kind = fields[0], fields[1]
        if not GRADCOMM_SYMBOL.match(name):
            continue
        if defined and kind not in GLOBAL_DEFINED:
            continue
        if not defined and kind not in ("U", "w"):
            continue
        symbols.add(name)
    return symbols


def demangle(names):
    if not names:
        return {}
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                             text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        out = names
    return dict(zip(names, out))


def closure(name, links):
    """Every layer `name` reaches through its links."""
    seen, todo = set(), list(links[name])
    while todo:
        layer = todo.pop()
        if layer not in seen:
            seen.add(layer)
            todo.extend(links[layer])
    seen.discard(name)
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nm", default="nm")
    parser.add_argument("--reverse", action="store_true", help="check against the upside-down order")
    parser.add_argument("--expect-violations", action="store_true", help="exit 0 only if violations are found")
    parser.add_argument("--layer", nargs=4, action="append", required=True, metavar=("NAME", "TARGET", "FILES", "LINKS"))
    args = parser.parse_args()

    layers = [(name, target, [f for f in files.split("|") if f], [l for l in links.split("|") if l])
              for name, target, files, links in args.layer]
    if args.reverse:
        layers.reverse()
    for name, _, files, _ in layers:
        if not files:
            sys.exit(f"check-layers: layer {name} has no files")
    rank = {name: i for i, (name, _, _, _) in enumerate(layers)}
    by_target = {target: name for name, target, _, _ in layers}
    lib_of = {name: files[0] if len(files) == 1 else f"{len(files)} objects" for name, _, files, _ in layers}
    links = {name: [by_target[t] for t in link if t in by_target and by_target[t] != name]
             for name, _, _, link in layers}

    defined = {name: nm_symbols(args.nm, files, True) for name, _, files, _ in layers}
    undefined = {name: nm_symbols(args.nm, files, False) - defined[name] for name, _, files, _ in layers}

    graph_problems, uses = [], []  # uses: (layer, symbol, where it is defined, kind)
    for name, _, _, _ in layers:
        reach = closure(name, links)
        for other in sorted(reach, key=rank.get):
            if rank[other] > rank[name]:
                graph_problems.append(f"layer {name} ({lib_of[name]}) links higher layer {other}")
        for sym in sorted(undefined[name]):
            homes = [other for other, _, _, _ in layers if other != name and sym in defined[other]]
            if any(h in reach and rank[h] < rank[name] for h in homes):
                continue
            uses.append((name, sym, homes))

    names = demangle(sorted({sym for _, sym, _ in uses}))
    problems = list(graph_problems)
    for name, sym, homes in uses:
        pretty = names.get(sym, sym)
        higher = [h for h in homes if rank[h] > rank[name]]
        if higher:
            where = ", ".join(higher)
            problems.append(f"layer {name} ({lib_of[name]}) uses {pretty} defined only in higher layer {where}")
        elif homes:
            problems.append(f"layer {name} ({lib_of[name]}) uses {pretty} defined in {', '.join(homes)}, "
                            f"which it does not link")
        else:
            problems.append(f"layer {name} ({lib_of[name]}) uses {pretty} defined in no layer")

    order = " < ".join(name for name, _, _, _ in layers)
    print(f"layer order (bottom up): {order}")
    for name, _, files, _ in layers:
        below = sorted(closure(name, links), key=rank.get)
        print(f"  {name}: {lib_of[name]}; {len(defined[name])} gradcomm:: symbols defined, "
              f"{len(undefined[name])} left undefined (links: {', '.join(below) or 'no layer'})")
    for p in problems:
        print(p)
    if args.expect_violations:
        if uses:
            print(f"ok: {len(uses)} symbol violations found, as expected")
            return 0
        print("FAIL: expected symbol violations, found none")
        return 1
    if problems:
        print(f"FAIL: {len(problems)} violations")
        return 1
    print("ok: every layer's undefined gradcomm:: symbols are defined in it or in a layer below that it links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
