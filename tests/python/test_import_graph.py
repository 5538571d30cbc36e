"""No import circle in the bitpush Python package (python/bitpush).

Reads the package's sources with `ast` (nothing is imported, so the test needs neither the
extension nor torch) and builds the graph of its modules' imports of one another: module level
and inside functions alike (`import`, `from ... import`, relative or absolute, and
`importlib.import_module` / `__import__` with a constant name). An edge goes to the module an
import names: `from . import x` to the submodule x when there is one, else to the package
(`x` is then a name its __init__ defines). The parent packages Python initialises on the way
are not edges: a package's __init__ re-exporting its submodules is no circle as long as no
submodule imports the package itself.
"""
import ast
import os

import pytest

PACKAGE = "bitpush"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", PACKAGE)
# Modules of the package that are built, not written in python/bitpush: they import none of it.
BUILT = ("_C", "_build_info")


def _modules(root=ROOT, package=PACKAGE):
    """{module name: (path, is_package)} of every .py file under `root`."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, root)
        parts = [package] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            if f == "__init__.py":
                out[".".join(parts)] = (os.path.join(dirpath, f), True)
            else:
                out[".".join(parts + [f[:-3]])] = (os.path.join(dirpath, f), False)
    return out


def _imports(name, path, is_package, known, package):
    """[(imported module, line)] of the package's modules that module `name` imports."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    here = name if is_package else name.rpartition(".")[0]  # what `from .` means in it
    found = []

    def add(target, node):
        if target == package or target.startswith(package + "."):
            found.append((target, node.lineno))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                sub = base + "." + alias.name
                add(sub if sub in known else base, node)
        elif isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if called in ("import_module", "__import__"):
                target = node.args[0].value
                if target.startswith("."):  # import_module(".x", package=...)
                    continue
                add(target, node)
    return found


def import_graph(root=ROOT, package=PACKAGE):
    """{module: {imported module: first line}} over the package's modules."""
    modules = _modules(root, package)
    known = set(modules) | {package + "." + m for m in BUILT}
    graph = {}
    for name, (path, is_package) in modules.items():
        edges = graph.setdefault(name, {})
        for target, line in _imports(name, path, is_package, known, package):
            if target != name:
                edges.setdefault(target, line)
    return graph


def find_cycle(graph):
    """One import circle as [m0, m1, ..., m0], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack = []

    def visit(m):
        color[m] = GREY
        stack.append(m)
        for n in sorted(graph.get(m, {})):
            if color.get(n, BLACK) == GREY:
                return stack[stack.index(n):] + [n]
            if color.get(n) == WHITE:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def _describe(graph, cycle):
    return " -> ".join(cycle) + "  (" + ", ".join(
        "%s imports %s at line %d" % (a, b, graph[a][b]) for a, b in zip(cycle, cycle[1:])) + ")"


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert "bitpush.torch" in graph and "bitpush.torch.optimizer" in graph, sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in python/bitpush: " + _describe(graph, cycle)


@pytest.mark.parametrize("files, cycle", [
    # A submodule importing its package lazily, inside a function, while the package's
    # __init__ re-exports it.
    ({"__init__.py": "from .a import f\n",
      "a.py": "def f():\n    import importlib\n    return importlib.import_module('pkg')\n"},
     ["pkg", "pkg.a", "pkg"]),
    # Two siblings, one at module level, one inside a function.
    ({"__init__.py": "", "a.py": "from .b import g\n",
      "b.py": "def g():\n    from . import a\n"},
     ["pkg.a", "pkg.b", "pkg.a"]),
    # `from . import name` where name is defined by the package's __init__.
    ({"__init__.py": "from .sub import x\nERR = 1\n", "sub/__init__.py": "from .y import x\n",
      "sub/y.py": "from .. import ERR\nx = ERR\n"},
     ["pkg", "pkg.sub", "pkg.sub.y", "pkg"]),
])
def test_a_circle_is_found_and_named(tmp_path, files, cycle):
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    graph = import_graph(str(tmp_path / "pkg"), "pkg")
    found = find_cycle(graph)
    assert found is not None
    # The same circle, from whichever module the search entered it.
    assert sorted(found[:-1]) == sorted(cycle[:-1]), found
    assert "imports" in _describe(graph, found)


def test_no_circle_in_a_package_that_only_re_exports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\nfrom .b import g\n")
    (pkg / "a.py").write_text("def f():\n    pass\n")
    (pkg / "b.py").write_text("from .a import f\n\ndef g():\n    from . import a\n")
    graph = import_graph(str(pkg), "pkg")
    assert find_cycle(graph) is None, graph
