#!/usr/bin/env python3
"""The module `use` graph of uhca's crates: import cycles and imports that run up the layers.

For each crate the script walks the module tree from the crate root (`mod x;`, `#[path]`,
inline `mod x { .. }`), reads every `use` (nested braces, `self`, `super`, `crate`, renames,
globs) and every `crate::`/`super::`/`self::` path written in code, and resolves each to the
file that defines the item: a path through a re-export (`pub use`, or a private `use` seen by a
child through `super::`) is followed to the file behind it, so a facade `mod.rs` that only
re-exports its children is not part of a cycle. Edges run between files; an inline module
belongs to its file. Test code (`#[cfg(test)]` modules and items) is left out unless `--tests`.

Two checks, each a list (and a non-zero exit status unless `--report`):
- cycles: the strongly connected components of more than one file (a file that imports,
  directly or through others, a file that imports it back), each with the edges inside it;
- layers (test code and the driver's `testing` fixtures left out likewise): an import from a file of a lower layer to a file of a higher one, after the
  layer order declared below for the crate (`LAYERS`).

Usage: scripts/module-graph.py [--report] [--tests] [--strict] [--edges] [--self-test] [CRATE...]
CRATE is a key of `CRATES` (default: all of them). Python 3 standard library only.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# crate key -> (crate root file, layers bottom up: each a list of module-path prefixes).
# A file belongs to the layer of the longest prefix that matches its module path; an import
# from layer i to layer j > i runs back up. Files of no layer (the crate root) are not checked.
CRATES = {
    "driver": (
        "driver/src/lib.rs",
        [
            ["pci", "dma", "barrier"],
            ["cmd"],
            # `eq` is the EQ ring both the control EQ (boot) and the completion EQs use.
            ["eq", "boot", "device", "pages", "health"],
            # The data path (rings, WQE building, CQ polling) is the mechanics the resources
            # own: a QP holds its send ring, so the data path sits under them.
            ["datapath"],
            # `handle`: the `Device` handle holds what its resources share that the device
            # state under them must not know (the completion-EQ pool); the resources define
            # their constructors on it, so it sits in their layer.
            ["resource", "peer", "cuda", "handle"],
            ["cm"],
            ["info"],
        ],
    ),
    "layout": ("hw/layout/src/lib.rs", []),
    # The tools' library: no layers declared, no cycle (the perf exchanges share `perf::role`,
    # `perf::gid` and `perf::pt_peer` below them and the harness).
    "tools": ("tools/src/lib.rs", []),
    "hw": (
        "hw/src/lib.rs",
        [
            ["rng", "copy"],
            ["link"],
            ["rc"],
            # The model, bottom up (mirroring the driver): memory and the IOMMU; BAR0,
            # config space and queue buffers; the tables of objects; the command engine
            # and handlers; the data path; the device thread on top.
            # What everything reads: the configuration, the counters, the lifecycle state.
            ["model::mem", "model::iommu", "model::remote", "model::bar_layout",
             "model::model_config", "model::counters", "model::lifecycle"],
            ["model::config", "model::health", "model::table", "model::caps"],
            ["model::eq", "model::pages", "model::memic", "model::mkey", "model::peer",
             "model::wq", "model::cq", "model::srq", "model::vport"],
            # `queues`: the data path's tables (DataPath); `sink`: CQEs of a QP's work.
            ["model::qp", "model::sq", "model::queues", "model::sink", "model::ud", "model::umr",
             "model::link_api"],
            # `Core`: the state the command engine and the data path share.
            ["model::state"],
            ["model::cmdif", "model::cmd"],
            ["model::datapath", "model::tests"],
            # `watch` is the device thread's idle check over the doorbells of every EQ and
            # queue in `Core`: part of the thread's loop, not a table under the resources.
            ["model::device", "model::watch", "model::fuzzing", "model"],
        ],
    ),
}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def mask(src):
    """Comments become spaces; string and char literal contents become spaces (the quotes stay).
    Offsets and line numbers are kept."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 20]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j
            for k in range(i + len(m.group(0)), j):
                if out[k] != "\n":
                    out[k] = " "
            i = j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(\\.[^']*|[^'\\])'", src[i:i + 12])
            if m:
                for k in range(i + 1, i + len(m.group(0)) - 1):
                    out[k] = " "
                i += len(m.group(0))
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def match_brace(text, i):
    """Index just past the brace that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


ATTR = r"(?:#\s*\[[^\]]*\]\s*)*"
VIS = r"(?:pub(?:\s*\([^)]*\))?\s+)?"
MOD_RE = re.compile(r"(" + ATTR + r")" + VIS + r"mod\s+(" + IDENT + r")\s*([;{])")
USE_RE = re.compile(r"(" + ATTR + r")(" + VIS + r")use\s+([^;]*);")
PATH_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:\s*::\s*" + IDENT + r")+)")
ITEM_RE = r"(?:fn|struct|enum|union|trait|type|const|static|mod|macro_rules!)\s+"


# Test code: `#[cfg(test)]`, `#[cfg(any(test, ..))]`, `#[cfg(all(test, ..))]`, and what the
# driver's `testing` feature builds (its fixtures).
TEST_CFG = r"#!?\s*\[\s*cfg\s*\(\s*(?:(?:any|all)\s*\(\s*)?(?:test\b|feature\s*=\s*\"testing\")[^\]]*\]"


def is_test(attrs):
    """`attrs` is raw source (string literals intact)."""
    return re.search(TEST_CFG, attrs) is not None


def expand_use(tree):
    """`a::{b, c::{d as e, *}, self}` -> [(['a','b'], 'b'), (['a','c','d'], 'e'), (['a','c','*'], None), (['a'], 'a')]."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, t):
        parts = split_top(t)
        for p in parts:
            if not p:
                continue
            if "{" in p:
                head, rest = p.split("{", 1)
                head = head.rstrip(":")
                segs = prefix + ([s for s in head.split("::") if s] if head else [])
                walk(segs, rest[:-1])
                continue
            alias = None
            if "as" in p and re.search(r"[^:]as" + IDENT, p):
                m = re.match(r"(.*?)as(" + IDENT + r")$", p)
                if m and not m.group(1).endswith(":"):
                    p, alias = m.group(1), m.group(2)
            segs = prefix + [s for s in p.split("::") if s]
            if segs and segs[-1] == "self":
                segs = segs[:-1]
            name = alias if alias else (segs[-1] if segs and segs[-1] != "*" else None)
            out.append((segs, name))

    walk([], tree)
    return out


def split_top(t):
    parts, depth, cur = [], 0, ""
    for ch in t:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


class Module:
    def __init__(self, path, file, parent, test):
        self.path = path  # tuple of segments from the crate root
        self.file = file  # repository-relative file that holds it
        self.parent = parent
        self.test = test
        self.children = {}
        self.uses = []  # (segs, name, is_pub, line, is_test)
        self.code_paths = []  # (segs, line, is_test)
        self.defs = set()


class Crate:
    def __init__(self, root_file, tests, strict):
        self.tests = tests
        self.strict = strict
        self.files = {}
        self.root = self.load(root_file, (), None, False, root_file, is_root=True)

    def load(self, file, path, parent, test, rel, is_root=False):
        with open(os.path.join(ROOT, file), encoding="utf-8") as f:
            raw = f.read()
        text = mask(raw)
        # A file whose inner attribute configures it for tests only (`#![cfg(test)]`).
        inner = re.search(r"^\s*#!\s*\[\s*cfg", raw, re.M)
        if inner and is_test(raw[inner.start():raw.find("]", inner.start()) + 1]):
            test = True
        m = Module(path, file, parent, test)
        self.files[file] = self.files.get(file, m)
        self.scan(m, raw, text, 0, len(text), file, is_root, test)
        return m

    def scan(self, mod, raw, text, start, end, file, is_root, test):
        """Read the module body text[start:end]: its child modules, uses and paths."""
        dirname = os.path.dirname(file)
        base = os.path.basename(file)
        if is_root or base == "mod.rs":
            child_dir = dirname
        else:
            child_dir = os.path.join(dirname, base[:-3])
        skip = []  # spans of inline child modules (read separately)
        i = start
        while True:
            m = MOD_RE.search(text, i, end)
            if not m:
                break
            name, kind = m.group(2), m.group(3)
            ctest = test or is_test(raw[m.start(1):m.end(1)])
            mod.defs.add(name)
            if kind == "{":
                b = m.end() - 1
                e = match_brace(text, b)
                child = Module(mod.path + (name,), file, mod, ctest)
                mod.children[name] = child
                self.scan(child, raw, text, b + 1, e - 1, file, False, ctest)
                # An inline module's own children live in a folder named after it.
                skip.append((m.start(), e))
                i = e
            else:
                pm = re.search(r'#\s*\[\s*path\s*=\s*"([^"]*)"', raw[m.start():m.end()])
                if pm:
                    # #[path] is relative to the folder of the declaring file.
                    cfile = os.path.normpath(os.path.join(dirname, pm.group(1)))
                else:
                    a = os.path.join(child_dir, name + ".rs")
                    b = os.path.join(child_dir, name, "mod.rs")
                    cfile = a if os.path.exists(os.path.join(ROOT, a)) else b
                if not ctest or self.tests:
                    mod.children[name] = self.load(cfile, mod.path + (name,), mod, ctest, cfile)
                i = m.end()
        # Test items that are not modules: `#[cfg(test)] fn/impl/use ...` are dropped below
        # by their attribute; uses inside inline modules were read by the recursion.
        body = list(text[start:end])
        for s, e in skip:
            for k in range(s - start, e - start):
                if body[k] != "\n":
                    body[k] = " "
        body = "".join(body)
        line0 = text.count("\n", 0, start)
        for m in re.finditer(ITEM_RE + r"(" + IDENT + r")", body):
            mod.defs.add(m.group(1))
        use_spans = []
        for m in USE_RE.finditer(body):
            vis, tree = m.group(2), m.group(3)
            t = test or is_test(raw[start + m.start(1):start + m.end(1)])
            line = line0 + body.count("\n", 0, m.start()) + 1
            for segs, name in expand_use(tree):
                mod.uses.append((segs, name, bool(vis.strip()), line, t))
            use_spans.append((m.start(), m.end()))
        # `#[cfg(test)]` items in braces (an impl, a fn) are test code too.
        test_spans = []
        for m in re.finditer(TEST_CFG, raw[start:end]):
            j = body.find("{", m.end())
            k = body.find(";", m.end())
            if j >= 0 and (k < 0 or j < k):
                test_spans.append((m.start(), match_brace(body, j)))
        for m in PATH_RE.finditer(body):
            if any(s <= m.start() < e for s, e in use_spans):
                continue
            t = test or any(s <= m.start() < e for s, e in test_spans)
            segs = [s.strip() for s in m.group(1).split("::")]
            line = line0 + body.count("\n", 0, m.start()) + 1
            mod.code_paths.append((segs, line, t))
        # Paths that start with a child module's name (`cq::poll(..)`) are imports too.
        for name in list(mod.children):
            for m in re.finditer(r"(?<![A-Za-z0-9_:.])" + name + r"\s*::\s*(" + IDENT + r")", body):
                if any(s <= m.start() < e for s, e in use_spans):
                    continue
                t = test or any(s <= m.start() < e for s, e in test_spans)
                line = line0 + body.count("\n", 0, m.start()) + 1
                mod.code_paths.append((["self", name, m.group(1)], line, t))

    # Resolution ------------------------------------------------------------------------

    def absolute(self, mod, segs):
        """Segments relative to `mod` -> (start module, rest), or None for another crate."""
        if not segs:
            return None
        cur, i = mod, 0
        if segs[0] == "crate":
            cur, i = self.root, 1
        elif segs[0] in ("self", "super"):
            while i < len(segs) and segs[i] in ("self", "super"):
                if segs[i] == "super":
                    cur = cur.parent
                    if cur is None:
                        return None
                i += 1
        elif segs[0] in mod.children:
            pass
        else:
            # A name brought in by a `use` of this module (`use crate::cmd; cmd::x`).
            for usegs, name, _, _, _ in mod.uses:
                if name == segs[0] and usegs and usegs[0] in ("crate", "self", "super"):
                    r = self.absolute(mod, usegs)
                    if r:
                        return r[0], r[1] + segs[1:]
            return None
        return cur, segs[i:]

    def resolve(self, mod, segs, seen=None):
        """The module (file) that defines what `segs` (relative to `mod`) names."""
        r = self.absolute(mod, segs)
        if r is None:
            return None
        cur, rest = r
        return self.walk(cur, rest, seen or set())

    def has_name(self, mod, seg):
        return seg in mod.defs or seg in mod.children or any(n == seg for _, n, _, _, _ in mod.uses)

    def walk(self, cur, rest, seen):
        k = 0
        while k < len(rest):
            seg = rest[k]
            if seg == "*":
                return cur
            if seg in cur.children:
                cur = cur.children[seg]
                k += 1
                continue
            key = (id(cur), seg)
            if key in seen:
                return cur
            seen.add(key)
            if seg in cur.defs:
                return cur
            # A name this module brings in by a `use`: follow it to where it is defined.
            hit = [u for u in cur.uses if u[1] == seg]
            if hit:
                usegs = hit[0][0]
                m = self.module_named(cur, usegs)
                if m is not None:
                    cur = m
                    k += 1
                    continue
                t = self.resolve(cur, usegs, seen)
                return cur if t is None else t
            for usegs, name, _, _, _ in cur.uses:
                if usegs and usegs[-1] == "*":
                    base = self.resolve(cur, usegs[:-1], seen)
                    if base is not None and self.has_name(base, seg):
                        return self.walk(base, rest[k:], seen)
            return cur
        return cur

    def module_named(self, mod, segs):
        """The module `segs` names, if it names a module (not an item)."""
        r = self.absolute(mod, segs)
        if r is None:
            return None
        cur, rest = r
        for s in rest:
            if s in cur.children:
                cur = cur.children[s]
            else:
                return None
        return cur

    def modules(self):
        stack = [self.root]
        while stack:
            m = stack.pop()
            yield m
            stack.extend(m.children.values())

    def edges(self):
        """(from file, to file, line, from module path, to module path) for every import."""
        out = []
        for m in self.modules():
            if m.test and not self.tests:
                continue
            items = [(segs, line, t, is_pub) for segs, _, is_pub, line, t in m.uses]
            items += [(segs, line, t, False) for segs, line, t in m.code_paths]
            for segs, line, t, is_pub in items:
                if t and not self.tests:
                    continue
                target = self.resolve(m, segs)
                if target is None or target.file == m.file:
                    continue
                # A re-export of a descendant (`pub use cq::Cq` in mod.rs) is a facade, not a
                # dependency of the file that re-exports.
                if is_pub and target.path[: len(m.path)] == m.path:
                    continue
                # A module's use of its enclosing module's items (`use super::VfioError`) is
                # a use of its own scope, not an import from another unit (unless --strict).
                if not self.strict and m.path[: len(target.path)] == target.path:
                    continue
                out.append((m.file, target.file, line, m.path, target.path))
        return out


def sccs(nodes, adj):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(adj.get(v, ())):
            if w not in index:
                strong(w)
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return out


def layer_of(path, layers):
    best, best_len = None, -1
    name = "::".join(path)
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if (name == p or name.startswith(p + "::")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def check(key, args):
    root_file, layers = CRATES[key]
    if not os.path.exists(os.path.join(ROOT, root_file)):
        return None
    crate = Crate(root_file, args.tests, args.strict)
    edges = crate.edges()
    adj = {}
    for a, b, *_ in edges:
        adj.setdefault(a, set()).add(b)
    nodes = set(crate.files)
    cycles = [c for c in sccs(nodes, adj) if len(c) > 1]
    problems = 0
    print(f"== {key} ({root_file}): {len(nodes)} files, {len(set((a, b) for a, b, *_ in edges))} file imports")
    if args.edges:
        for a, b, line, *_ in sorted(set(edges)):
            print(f"  {a}:{line} -> {b}")
    for comp in cycles:
        problems += 1
        members = set(comp)
        print(f"cycle ({len(comp)} files): " + " ".join(comp))
        seen = set()
        for a, b, line, *_ in sorted(edges):
            if a in members and b in members and (a, b) not in seen:
                seen.add((a, b))
                print(f"    {a}:{line} -> {b}")
    seen = set()
    for a, b, line, pa, pb in sorted(edges):
        la, lb = layer_of(pa, layers), layer_of(pb, layers)
        if la is not None and lb is not None and lb > la and (a, b) not in seen:
            seen.add((a, b))
            problems += 1
            print(f"up a layer: {a}:{line} ({'/'.join(layers[la])}) -> {b} ({'/'.join(layers[lb])})")
    print(f"{key}: {len(cycles)} cycles, {len(seen)} imports up a layer")
    return problems


def self_test():
    """The checker on a small crate written to a temporary folder: what it must find."""
    import tempfile

    global ROOT
    files = {
        "src/lib.rs": "mod a;\npub mod b;\n#[path = \"c_impl.rs\"]\nmod c;\nmod d;\nmod e;\npub use b::Thing;\n",
        "src/a.rs": "use crate::{b::{self, Thing as T}, c::*};\n// use crate::d::X;\nconst S: &str = \"crate::d::X\";\n",
        "src/b/mod.rs": "mod inner;\npub use inner::Thing;\npub struct Other;\n#[cfg(test)]\nmod tests { use crate::d::X; }\n",
        "src/b/inner.rs": "use super::Other;\npub struct Thing;\nfn f() { crate::c::g(); }\n",
        "src/c_impl.rs": "pub fn g() {}\npub fn h() { super::Thing; }\n",
        "src/e.rs": "//! A fixture.\n\n#![cfg(any(test, feature = \"testing\"))]\nuse crate::d::X;\n",
        "src/d.rs": "pub struct X;\nfn f() -> crate::a::Y { todo!() }\n"
        "#[cfg(any(test, feature = \"testing\"))]\nfn g() { crate::b::Other; }\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        ROOT = tmp
        crate = Crate("src/lib.rs", False, False)
        got = sorted(set((a, b) for a, b, *_ in crate.edges()))
        want = [
            ("src/a.rs", "src/b/inner.rs"),  # `Thing as T` through the facade's `pub use`
            ("src/a.rs", "src/b/mod.rs"),  # `b::{self}`
            ("src/a.rs", "src/c_impl.rs"),  # `c::*`, through #[path]
            ("src/b/inner.rs", "src/c_impl.rs"),  # a path in code
            ("src/c_impl.rs", "src/b/inner.rs"),  # `super::Thing`: lib.rs re-exports it
            ("src/d.rs", "src/a.rs"),
        ]
        assert got == want, got
        strict = sorted(set((a, b) for a, b, *_ in Crate("src/lib.rs", False, True).edges()))
        assert ("src/b/inner.rs", "src/b/mod.rs") in strict, strict
        tests = sorted(set((a, b) for a, b, *_ in Crate("src/lib.rs", True, False).edges()))
        assert ("src/b/mod.rs", "src/d.rs") in tests, tests
        assert ("src/d.rs", "src/b/mod.rs") in tests, tests  # a fixture of feature testing
        assert ("src/e.rs", "src/d.rs") in tests, tests  # a file configured out by #![cfg]
        adj = {}
        for a, b in got:
            adj.setdefault(a, set()).add(b)
        cycles = [c for c in sccs(set(crate.files), adj) if len(c) > 1]
        assert cycles == [["src/b/inner.rs", "src/c_impl.rs"]], cycles
    print("self-test passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("crates", nargs="*", help="crate keys: " + ", ".join(CRATES))
    ap.add_argument("--report", action="store_true", help="list the problems, exit 0")
    ap.add_argument("--tests", action="store_true", help="include #[cfg(test)] code")
    ap.add_argument("--strict", action="store_true", help="count a module's uses of its ancestors' items")
    ap.add_argument("--edges", action="store_true", help="print every file import")
    ap.add_argument("--self-test", action="store_true", help="check the checker on a made-up crate")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    total = 0
    for key in args.crates or list(CRATES):
        if key not in CRATES:
            ap.error(f"unknown crate {key}")
        n = check(key, args)
        total += n or 0
    if total and not args.report:
        sys.exit(1)


if __name__ == "__main__":
    main()
