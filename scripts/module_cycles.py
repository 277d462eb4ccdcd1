#!/usr/bin/env python3
"""Prints the module import graph of a crate's src/ and its cycles.

A module's edges are the `crate::<module>` paths it names (in `use` lines
and in code), so `crate::{a, b::C}` counts `a` and `b`. The crate root
(lib.rs, or main.rs of a binary) is the module `lib` (or `main`); it names a
module when it uses an item of it (not for its `mod` lines). Exits 1 when there is a cycle.

    python3 scripts/module_cycles.py crates/oncelog-broker/src
"""
import re
import sys
from pathlib import Path


def modules(src: Path) -> dict[str, Path]:
    out = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if rel.parts[0] == "bin":
            continue
        top = rel.parts[0].removesuffix(".rs")
        out.setdefault(top, [])
        out[top].append(f)
    return out


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def names(text: str, known: set[str]) -> set[str]:
    found = set()
    # crate::a::..., crate::{a, b::c, ...} (one level of braces is enough here)
    for m in re.finditer(r"crate::\{([^}]*)\}", text):
        for part in m.group(1).split(","):
            head = part.strip().split("::")[0].split(" ")[0]
            if head in known:
                found.add(head)
    for m in re.finditer(r"crate::([A-Za-z_][A-Za-z0-9_]*)", text):
        head = m.group(1)
        if head in known:
            found.add(head)
        elif head != "":
            found.add(ROOT)  # an item of the crate root (crate::Broker, crate::now_ms)
    return found


ROOT = "lib"


def main() -> int:
    global ROOT
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "crates/oncelog-broker/src")
    mods = modules(src)
    ROOT = "lib" if "lib" in mods else "main"
    known = set(mods) - {ROOT}
    graph: dict[str, set[str]] = {}
    for m, files in mods.items():
        text = ""
        for f in files:
            t = strip_comments(f.read_text())
            # tests may reach anywhere; they are not part of the structure
            t = re.split(r"#\[cfg\(test\)\]", t)[0]
            text += t
        found = names(text, known | {ROOT})
        if m == ROOT:
            text = re.sub(r"^\s*(pub )?mod .*$", "", text, flags=re.M)
            # lib.rs names its modules without `crate::`.
            found |= {h for h in re.findall(r"\b([a-z_][a-z0-9_]*)::", text) if h in known}
        graph[m] = {n for n in found if n != m}
    for m in sorted(graph):
        print(f"{m} -> {', '.join(sorted(graph[m])) or '-'}")
    # Strongly connected components (Tarjan).
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v, counter=[0]):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    if comps:
        for c in comps:
            print("cycle:", " <-> ".join(c))
        return 1
    print("no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
