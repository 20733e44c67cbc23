"""Kiln's modules import downward only: no import circle among them, counting imports inside functions too (a lazy
import that closes a circle still ties the two layers together). `from pkg import module` counts as a dependency on
the module only (`from kiln.zoo import calib` in kiln/zoo/vision.py), not on pkg's __init__, which Python runs first
but whose code the importer does not use."""
from __future__ import annotations

import ast
import pathlib

import kiln

ROOT = pathlib.Path(kiln.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ("kiln",) + p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            # `from pkg import module` depends on the module; names defined in pkg's own code depend on pkg
            targets = subs + ([base] if len(subs) < len(node.names) else [])
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles() -> None:
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the scan sees Kiln's imports
    assert _circles(graph) == []


def test_the_check_finds_a_circle() -> None:
    """The detector itself: a circle of three and a tail, and a package importing its own module, not a circle."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"p": {"p.m"}, "p.m": set()}) == []


def test_the_tuner_sits_below_the_compiler() -> None:
    """kiln.tune is a layer below kiln.compiler: nothing in it imports the compiler module or the kiln package."""
    mods = _modules()
    for m, p in mods.items():
        if m.startswith("kiln.tune"):
            assert not {"kiln.compiler", "kiln"} & _imports(m, p, set(mods)), m
