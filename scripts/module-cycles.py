#!/usr/bin/env python3
"""Module-level dependency cycles in the workspace's crates.

cargo-modules (`cargo modules dependencies --acyclic`) checks cycles between
*items* (a type and its own methods form one), so it cannot answer "do two
modules import each other?". This does, from the source: every path a
module names (`use`, or an inline `crate::…`/`super::…`/`self::…` path, or a
path starting with one of its own child modules) is resolved to the deepest
module it reaches, and each is an edge. `#[cfg(test)]` modules (unit tests
that `use super::*`) are left out, as are a module's edges to itself.
Prints every strongly connected component of more than one module and
exits 1 if there is any.

    scripts/module-cycles.py [CRATE_DIR...]   (default: every crates/*)
"""
import os, re, sys

def modules_of(src):
    """module path (tuple) -> file, from the file layout and `mod` lines."""
    mods = {}
    roots = [f for f in ('lib.rs', 'main.rs') if os.path.exists(os.path.join(src, f))]
    def walk(path, file):
        mods[path] = file
        text = open(file).read()
        base = os.path.dirname(file)
        stem = os.path.basename(file)[:-3]
        sub = base if stem in ('lib', 'main', 'mod') else os.path.join(base, stem)
        lines = text.split('\n')
        # `internal! { a; b; }` (namzu-kubernetes) declares modules too.
        block = re.search(r'\binternal!\s*\{([^}]*)\}', text)
        if block:
            lines = lines + ['mod %s;' % n for n in re.findall(r'(\w+)\s*;', block.group(1))]
        for i, line in enumerate(lines):
            m = re.match(r'\s*(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*;', line)
            if not m:
                continue
            prev = '\n'.join(lines[max(0, i - 3):i])
            if '#[cfg(test)]' in prev:
                continue
            name = m.group(3)
            pm = re.search(r'#\[path\s*=\s*"([^"]+)"\]', prev)
            if pm:
                child = os.path.join(base, pm.group(1))
            else:
                child = os.path.join(sub, name + '.rs')
                if not os.path.exists(child):
                    child = os.path.join(sub, name, 'mod.rs')
            if os.path.exists(child):
                walk(path + (name,), child)
    for r in roots:
        walk((), os.path.join(src, r))
    return mods

def strip(text):
    text = re.sub(r'//[^\n]*', '', text)
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    # drop #[cfg(test)] inline modules
    out, i = [], 0
    for m in re.finditer(r'#\[cfg\(test\)\]\s*mod\s+\w+\s*\{', text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 0, m.end() - 1
        while j < len(text):
            if text[j] == '{': depth += 1
            elif text[j] == '}':
                depth -= 1
                if depth == 0: break
            j += 1
        i = j + 1
    out.append(text[i:])
    return ''.join(out)

def use_paths(text):
    """Every path a file names: `use` trees expanded, plus inline paths."""
    paths = []
    for m in re.finditer(r'\buse\s+([^;]+);', text):
        tree = re.sub(r'\s+', '', m.group(1))
        paths.extend(expand(tree))
    for m in re.finditer(r'(?<![\w:])((?:crate|super|self)(?:::\w+)+)', text):
        paths.append(m.group(1))
    return paths

def expand(tree):
    i = tree.find('{')
    if i < 0:
        return [tree.split(' as ')[0]]
    prefix, inner = tree[:i], tree[i + 1:-1]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand(prefix + part)]

def reexports_of(mod, text):
    """`pub use` lines of a module: item name -> the path it re-exports,
    and the paths of its glob re-exports."""
    named, globs = {}, []
    for m in re.finditer(r'\bpub(\([^)]*\))?\s+use\s+([^;]+);', text):
        for p in expand(re.sub(r'\s+', '', m.group(2))):
            if p.endswith('::*'):
                globs.append(p[:-3])
            else:
                name = p.split('::')[-1]
                named[name] = p
    return named, globs

REEXPORTS = {}

def resolve(mod, path, mods, depth=0):
    segs = [s for s in path.split('::') if s]
    if not segs:
        return None
    if segs[0] == 'crate':
        base, segs = (), segs[1:]
    elif segs[0] in ('super', 'self'):
        base = mod
        while segs and segs[0] in ('super', 'self'):
            if segs[0] == 'super':
                base = base[:-1]
            segs = segs[1:]
    elif mod + (segs[0],) in mods:
        base = mod
    else:
        return None
    cur = base
    rest = list(segs)
    while rest and cur + (rest[0],) in mods:
        cur = cur + (rest.pop(0),)
    # An item the module only re-exports lives where it is defined: follow
    # `pub use` (and a single glob) as name resolution does.
    if rest and depth < 8 and cur in REEXPORTS:
        named, globs = REEXPORTS[cur]
        if rest[0] in named and named[rest[0]] != path:
            t = resolve(cur, named[rest[0]] + ''.join('::' + r for r in rest[1:]), mods, depth + 1)
            if t is not None:
                return t
        for g in globs:
            gm = resolve(cur, g, mods, depth + 1)
            if gm is not None and gm != cur:
                t = resolve(gm, 'self::' + '::'.join(rest), mods, depth + 1)
                if t is not None and defines(gm, rest[0], mods):
                    return t
    return cur

def defines(mod, name, mods):
    text = strip(open(mods[mod]).read())
    return re.search(r'\b(struct|enum|trait|type|fn|const|static|mod|union)\s+' + re.escape(name) + r'\b', text) is not None or name in REEXPORTS.get(mod, ({}, []))[0]

def sccs(nodes, edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def strong(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            strong(v)
    return out

def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    crates = sys.argv[1:] or sorted(
        os.path.join(root, 'crates', c) for c in os.listdir(os.path.join(root, 'crates')))
    bad = 0
    for crate in crates:
        src = os.path.join(crate, 'src')
        if not os.path.isdir(src):
            continue
        mods = modules_of(src)
        REEXPORTS.clear()
        for mod, file in mods.items():
            REEXPORTS[mod] = reexports_of(mod, strip(open(file).read()))
        edges, count = {}, 0
        for mod, file in mods.items():
            for p in use_paths(strip(open(file).read())):
                t = resolve(mod, p, mods)
                if t is not None and t != mod:
                    edges.setdefault(mod, set()).add(t)
        count = sum(len(v) for v in edges.values())
        cycles = [c for c in sccs(list(mods), edges) if len(c) > 1]
        name = os.path.basename(os.path.normpath(crate))
        print(f'{name}: {len(mods)} modules, {count} edges, {len(cycles)} cycles')
        for c in cycles:
            bad += 1
            print('  cycle: ' + ' <-> '.join('::'.join(m) or 'crate' for m in sorted(c)))
    sys.exit(1 if bad else 0)

main()
