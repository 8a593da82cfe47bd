#!/usr/bin/env python3
"""Module import cycles between sibling modules, per crate.

Usage: scripts/cycles.py [ROOT]   (ROOT: the workspace, default this checkout)

A file of module A that names a path of module B (`crate::b::...`,
`super::b`, `self::b`) makes an edge between the two children of their
common parent that contain A and B. Every strongly connected set of more
than one module is a cycle: printed one a line as `crate a <-> b`, and the
exit status is 1. Nothing is printed when there is none. Comments and an
inline `#[cfg(test)] mod tests { ... }` at the end of a file do not count.
"""
import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r'\b((?:crate|super|self)(?:::\w+)+)')
INLINE_TESTS = re.compile(r'#\[cfg\(test\)\]\s*mod tests\s*\{.*', re.S)


def module_of(path, src):
    """The module path of a source file, as a tuple of names."""
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ('mod', 'lib', 'main'):
        parts = parts[:-1]
    return tuple(parts)


def edges_of(src):
    files = [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith('.rs')]
    mods = {module_of(f, src): f for f in files}
    edges = defaultdict(set)
    for m, f in mods.items():
        with open(f, encoding='utf-8') as fh:
            text = re.sub(r'//.*', '', fh.read())
        text = INLINE_TESTS.sub('', text)
        # `super` from a mod.rs is the parent of its directory's module,
        # from any other file the parent of the file's module: both m[:-1].
        for path in PATH.findall(text):
            head, *rest = path.split('::')
            target = {'crate': [], 'self': list(m), 'super': list(m)[:-1]}[head]
            while rest and rest[0] == 'super':
                target, rest = target[:-1], rest[1:]
            for name in rest:
                if tuple(target + [name]) not in mods:
                    break
                target.append(name)
            a, b = m, tuple(target)
            i = 0
            while i < min(len(a), len(b)) and a[i] == b[i]:
                i += 1
            if i < len(a) and i < len(b):
                edges[a[:i + 1]].add(b[:i + 1])
    return edges


def cycles(edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    found = 0
    crates = os.path.join(root, 'crates')
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, 'src')
        if not os.path.isdir(src):
            continue
        for comp in cycles(edges_of(src)):
            found += 1
            print(crate, ' <-> '.join('::'.join(m) for m in comp))
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
