#!/usr/bin/env python3
"""Prints the module import graph of a crate's src/ and its cycles.

Every file is a module, named by its path inside the crate (`backend/logs.rs`
is `backend::logs`, `backend/mod.rs` is `backend`, the crate root lib.rs or
main.rs is `lib` or `main`), so the check looks inside folders: a module of
one folder that imports a module of another which imports it back is a
cycle, and so are two files of one folder that import each other.

A module's edges are the modules it names in code and `use` lines: paths
from `crate::` (`crate::{a, b::C}` counts `a` and `b`), from `super::` and
`self::`, and its own child modules named bare. A path names the longest
module it starts with; an item of the crate root (`crate::Broker`) names
the root. A folder's mod.rs composes the files of its folder, which may
use it: its edges into its own folder are not counted (nor its `mod` and
`pub use` lines), and the crate root's edges are not counted.
Tests (`#[cfg(test)]` and below) are not part of the structure.

Then prints how the top-level folders use each other (for reading; a
folder's files may be layered across others' without a cycle of files).

Exits 1 when there is a cycle.

    python3 scripts/module_cycles.py crates/oncelog-broker/src
"""
import re
import sys
from pathlib import Path


def module_of(src: Path, f: Path) -> str | None:
    rel = f.relative_to(src)
    if rel.parts[0] == "bin":
        return None
    parts = list(rel.parts)
    name = parts[-1].removesuffix(".rs")
    if len(parts) == 1 and name in ("lib", "main"):
        return ROOT
    if name == "mod":
        parts = parts[:-1]
    else:
        parts[-1] = name
    return "::".join(parts)


def strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(line.split("//")[0] for line in text.splitlines())
    # tests may reach anywhere; they are not part of the structure
    text = re.split(r"#\[cfg\(test\)\]", text)[0]
    # string literals name no module
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


ROOT = "lib"


def expand_braces(text: str) -> list[str]:
    """`crate::{a, b::{c, d}}` as `crate::a`, `crate::b::c`, `crate::b::d` (one
    level of nested braces), for `crate`, `super` and `self` prefixes."""
    out = []
    for m in re.finditer(r"\b((?:crate|super|self|bare)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{((?:[^{}]|\{[^{}]*\})*)\}", text):
        head, body = m.group(1), m.group(2)
        for part in re.split(r",(?![^{]*\})", body):
            part = part.strip()
            if not part:
                continue
            inner = re.match(r"([A-Za-z0-9_:]*?)::\{([^}]*)\}", part)
            if inner:
                for q in inner.group(2).split(","):
                    out.append(f"{head}::{inner.group(1)}::{q.strip().split(' ')[0]}")
            else:
                out.append(f"{head}::{part.split(' ')[0]}")
    return out


def resolve(path: list[str], known: set[str]) -> str:
    """The longest known module `path` starts with (the root if none)."""
    for n in range(len(path), 0, -1):
        cand = "::".join(path[:n])
        if cand in known:
            return cand
    return ROOT


def parent(m: str) -> str:
    return ROOT if "::" not in m else m.rsplit("::", 1)[0]


def edges(m: str, is_dir_module: bool, text: str, known: set[str]) -> set[str]:
    found = set()
    # the module a `super::` in this file means
    here = m if m != ROOT else ""
    sup = parent(m) if m != ROOT else ROOT
    paths = expand_braces(text)
    paths += re.findall(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+", text)
    for p in paths:
        segs = [s for s in p.split("::") if s]
        if segs[0] == "crate":
            found.add(resolve(segs[1:], known))
        elif segs[0] == "super":
            base = [] if sup == ROOT else sup.split("::")
            rest = segs[1:]
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
            found.add(resolve(base + rest, known))
        elif segs[0] == "self":
            base = [] if not here else here.split("::")
            found.add(resolve(base + segs[1:], known))
    # a folder module (or the root) names its children bare; its `mod` and
    # `pub use` lines are declarations, not uses
    if is_dir_module or m == ROOT:
        body = re.sub(r"^\s*(pub(\([^)]*\))? )?mod .*$", "", text, flags=re.M)
        body = re.sub(r"^\s*pub(\([^)]*\))? use [^;]*;", "", body, flags=re.M | re.S)
        prefix = [] if m == ROOT else m.split("::")
        bare = [p[len("bare::"):] for p in expand_braces(re.sub(r"(?<![:\w])(?=[a-z_][a-z0-9_]*::\{)", "bare::", body))
                if p.startswith("bare::")]
        bare += re.findall(r"(?<![:\w])[a-z_][a-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+", body)
        for p in bare:
            segs = p.split("::")
            if "::".join(prefix + segs[:1]) in known:
                found.add(resolve(prefix + segs, known))
        for h in re.findall(r"^\s*use ([a-z_][a-z0-9_]*)(?:::|;)", body, flags=re.M):
            if "::".join(prefix + [h]) in known:
                found.add("::".join(prefix + [h]))
    found.discard(m)
    # a folder module composes its files, which may use it: its edges into
    # its own folder are not counted (the root's into the whole crate)
    if is_dir_module or m == ROOT:
        found = {n for n in found if not (m == ROOT or n.startswith(m + "::"))}
    return found


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
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
    return comps


def main() -> int:
    global ROOT
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "crates/oncelog-broker/src")
    ROOT = "main" if (src / "main.rs").exists() and not (src / "lib.rs").exists() else "lib"
    files = {}
    for f in sorted(src.rglob("*.rs")):
        m = module_of(src, f)
        if m is not None:
            files[m] = f
    known = set(files)
    graph = {}
    for m, f in files.items():
        graph[m] = edges(m, f.name in ("mod.rs", "lib.rs", "main.rs"), strip(f.read_text()), known)
    for m in sorted(graph):
        print(f"{m} -> {', '.join(sorted(graph[m])) or '-'}")
    top = {}
    for m, out in graph.items():
        a = m.split("::")[0]
        for n in out:
            b = n.split("::")[0]
            if a != b:
                top.setdefault(a, set()).add(b)
    print("\nfolders:")
    for a in sorted(top):
        print(f"  {a} uses {', '.join(sorted(top[a]))}")
    comps = cycles_of(graph)
    if comps:
        for c in comps:
            print("cycle:", " <-> ".join(c))
        return 1
    print("no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
