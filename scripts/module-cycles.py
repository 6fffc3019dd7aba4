#!/usr/bin/env python3
"""Import cycles among the modules of a Rust crate, at every level of its module tree.

usage: module-cycles.py [SRC_DIR]   (default: src)

Reads the paths the code names (`crate::a::b`, `super::c`, `use` trees with their groups) and
ties each module to the sibling modules it names: `call/attempt.rs` naming `crate::call::outcome`
ties `call::attempt` to `call::outcome`, and `call/` naming `crate::instance` ties the top-level
`call` to `instance`. Then prints each group of siblings that reach one another (a strongly
connected component of more than one module) with the lines that tie them, and exits 1 if there
is any, 0 if none. A module naming its parent's own items (those of `mod.rs` or `lib.rs`) or its
own children is not a tie: a parent declares its children. Comments and string literals are left
out; test modules count as code."""
import os
import re
import sys
from collections import defaultdict

src = sys.argv[1] if len(sys.argv) > 1 else "src"


def module_of(rel):
    """`call/attempt.rs` -> ("call", "attempt"); `call/mod.rs` -> ("call",); `lib.rs` -> ()."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip(text):
    """The code without comments, string and char literals, and test modules; newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append("\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    return code


def expand(tree):
    """The paths of a `use` tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = tree.strip()
    depth = 0
    for k, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                prefix, inner = tree[:k], tree[k + 1:tree.rindex("}")]
                parts, d, start = [], 0, 0
                for q, ch2 in enumerate(inner):
                    d += {"{": 1, "}": -1}.get(ch2, 0)
                    if ch2 == "," and d == 0:
                        parts.append(inner[start:q])
                        start = q + 1
                parts.append(inner[start:])
                return [p for part in parts if part.strip() for p in expand(prefix + part.strip())]
            depth += 1
    return [re.sub(r"\s+as\s+\w+$", "", tree)]


def resolve(path, here):
    """Absolute module path segments of `path` named in module `here`, or None."""
    segs = [s for s in re.split(r"\s*::\s*", path) if s]
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs.pop(0) == "super":
                if not base:
                    return None
                base.pop()
        return base + segs
    return None


modules, files = set(), {}
for root, _, names in os.walk(src):
    for f in names:
        if f.endswith(".rs"):
            rel = os.path.relpath(os.path.join(root, f), src)
            files[rel] = module_of(rel)
            modules.add(files[rel])
# Every ancestor of a file's module is a module too.
for m in list(modules):
    for k in range(len(m)):
        modules.add(m[:k])

edges, why = defaultdict(set), defaultdict(list)
for rel, here in sorted(files.items()):
    with open(os.path.join(src, rel), encoding="utf-8", errors="replace") as fh:
        code = strip(fh.read())
    named = []  # (line, path)
    for m in re.finditer(r"\buse\s+([^;]*);", code):
        line = code.count("\n", 0, m.start()) + 1
        named += [(line, p) for p in expand(m.group(1))]
    outside_use = re.sub(r"\buse\s+[^;]*;", lambda m: "\n" * m.group(0).count("\n"), code)
    for m in re.finditer(r"\b(?:crate|super|self)(?:\s*::\s*(?:super|\w+))+", outside_use):
        named.append((outside_use.count("\n", 0, m.start()) + 1, m.group(0)))
    for line, path in named:
        target = resolve(path, here)
        if target is None:
            continue
        # The deepest module the path names (the rest are items in it).
        target = tuple(target)
        while target not in modules:
            target = target[:-1]
        common = 0
        while common < min(len(here), len(target)) and here[common] == target[common]:
            common += 1
        if common == len(here) or common == len(target):
            continue  # its own child, its own item, or an ancestor's item
        parent, a, b = here[:common], here[common], target[common]
        edges[(parent, a)].add(b)
        why[(parent, a, b)].append(f"{rel}:{line}")

index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def visit(parent, v):
    key = (parent, v)
    index[key] = low[key] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(key)
    for w in sorted(edges.get(key, ())):
        wk = (parent, w)
        if wk not in index:
            visit(parent, w)
            low[key] = min(low[key], low[wk])
        elif wk in on:
            low[key] = min(low[key], index[wk])
    if low[key] == index[key]:
        comp = []
        while True:
            w = stack.pop()
            on.discard((parent, w))
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append((parent, sorted(comp)))


sys.setrecursionlimit(10000)
for (parent, v) in sorted(edges):
    if (parent, v) not in index:
        visit(parent, v)

for parent, comp in sccs:
    where = "::".join(parent) or "crate"
    print(f"cycle among {len(comp)} modules of {where}: {', '.join(comp)}")
    for a in comp:
        for b in sorted(edges[(parent, a)]):
            if b in comp:
                lines = why[(parent, a, b)]
                shown = ", ".join(lines[:6]) + (f" (+{len(lines) - 6})" if len(lines) > 6 else "")
                print(f"  {a} -> {b}: {shown}")
if not sccs:
    levels = len({p for p, _ in edges})
    print(f"no import cycle among the {len(modules) - 1} modules of {src} ({levels} levels with ties)")
sys.exit(1 if sccs else 0)
