#!/usr/bin/env python3
"""Import graph of a Rust crate's modules, from `crate::` paths in its sources.

(The team's shared module-graph tool, kept here so the test script can hold
the one-way layering without anything outside the repository.)

Usage: modgraph.py SRC_DIR [--max-scc N] [--max-lines N] [--never A:B ...]
Prints the strongly connected components (import circles) with more than one
file, the largest files, and any forbidden edge A -> B (path prefixes under
SRC_DIR, e.g. binding/:exec/). Exits 1 when a limit is broken.
"""
import os, re, sys, argparse

ap = argparse.ArgumentParser()
ap.add_argument("src")
ap.add_argument("--max-scc", type=int, default=None)
ap.add_argument("--max-lines", type=int, default=None)
ap.add_argument("--never", action="append", default=[])
ap.add_argument("--top", action="store_true", help="collapse files into top-level modules (a folder is one node)")
a = ap.parse_args()
src = a.src.rstrip("/")

files = {}
for root, _, names in os.walk(src):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.join(root, n)
            files[os.path.relpath(p, src)] = open(p, encoding="utf-8").read()

def module_path(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)

mods = {module_path(r): r for r in files}
# private.rs is mounted as __private in lib.rs
if ("private",) in mods:
    mods[("__private",)] = mods[("private",)]

def resolve(path):
    """Longest module prefix of a crate:: path."""
    segs = tuple(path)
    for k in range(len(segs), 0, -1):
        if segs[:k] in mods:
            return mods[segs[:k]]
    return None

def strip_comments(t):
    t = re.sub(r"//[^\n]*", "", t)
    return re.sub(r"/\*.*?\*/", "", t, flags=re.S)

def expand_use(body):
    """crate::a::{b, c::d} -> [[a,b],[a,c,d]] (one level of braces is enough here)."""
    out = []
    m = re.match(r"\s*([\w:]*?)::\{(.*)\}\s*$", body, re.S)
    if m:
        base = [s for s in m.group(1).split("::") if s]
        depth, cur, items = 0, "", []
        for ch in m.group(2):
            if ch == "{": depth += 1
            if ch == "}": depth -= 1
            if ch == "," and depth == 0:
                items.append(cur); cur = ""
            else:
                cur += ch
        items.append(cur)
        for it in items:
            it = it.strip()
            if not it: continue
            if "{" in it:
                for sub in expand_use(it):
                    out.append(base + sub)
            else:
                out.append(base + [s for s in re.split(r"::|\s+as\s+", it)[0].split("::") if s])
    else:
        out.append([s for s in re.split(r"\s+as\s+", body.strip())[0].split("::") if s])
    return out

edges = {r: set() for r in files}
for rel, text in files.items():
    t = strip_comments(text)
    # this module's own path, for super::
    me = list(module_path(rel))
    for m in re.finditer(r"\buse\s+(crate::|super::|self::|)(\w+::.*?|\{.*?\});", t, re.S):
        kind = m.group(1)
        body = m.group(2)
        if kind == "crate::":
            base = []
        elif kind == "super::":
            base = me[:-1]
        elif kind == "self::":
            base = me
        else:
            first = re.split(r"::", body, 1)[0]
            if tuple(me + [first]) not in mods:
                continue  # an external crate
            base = me
        for p in expand_use(body):
            tgt = resolve(base + [s for s in p if s not in ("self",)])
            if tgt and tgt != rel:
                edges[rel].add(tgt)
    for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", t):
        tgt = resolve(m.group(1).split("::"))
        if tgt and tgt != rel:
            edges[rel].add(tgt)

if a.top:
    def top(r):
        return r.split("/")[0] + "/" if "/" in r else r
    col = {}
    for s_, ds in edges.items():
        col.setdefault(top(s_), set())
        for d in ds:
            if top(d) != top(s_):
                col[top(s_)].add(top(d))
    for d in list(col.values()):
        for x in d:
            col.setdefault(x, set())
    edges = col
    files_nodes = list(col)
else:
    files_nodes = list(files)

# Tarjan
index, low, stack, on, sccs, i = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        c = []
        while True:
            w = stack.pop(); on.discard(w); c.append(w)
            if w == v: break
        sccs.append(c)
for v in files_nodes:
    if v not in index:
        strong(v)

# lib.rs re-exports everything: edges into lib.rs are re-export paths, not layering
circles = [sorted(c) for c in sccs if len(c) > 1]
circles.sort(key=len, reverse=True)
bad = False
for c in circles:
    print(f"circle of {len(c)}: {' '.join(c)}")
largest = max((len(c) for c in circles), default=0)
sizes = sorted(((t.count("\n"), r) for r, t in files.items()), reverse=True)
print("largest files: " + ", ".join(f"{r} {n}" for n, r in sizes[:5]))
for rule in a.never:
    x, y = rule.split(":")
    hits = [(s, d) for s, ds in edges.items() for d in ds if s.startswith(x) and d.startswith(y)]
    for s, d in hits:
        print(f"forbidden edge {s} -> {d}")
    bad |= bool(hits)
if a.max_scc is not None and largest > a.max_scc:
    bad = True
if a.max_lines is not None and sizes and sizes[0][0] > a.max_lines:
    bad = True
print(f"largest circle: {largest} files; largest file: {sizes[0][1]} {sizes[0][0]} lines")
sys.exit(1 if bad else 0)
