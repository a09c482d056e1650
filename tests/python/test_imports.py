"""The modules of python/c10d import one another without a cycle (imports inside functions
included): a module that needs one that imports it is handed what it needs instead."""

import ast
import os

from dist import harness

PACKAGE = os.path.join(harness.REPO, "python", "c10d")


def module_imports():
    """{module: the package's modules it imports}, read from the sources."""
    paths = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                paths[module.removesuffix(".__init__")] = path
    graph = {}
    for module, path in paths.items():
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        found = set()
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the package, up level - 1 packages
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    name = f"{target}.{alias.name}"
                    found.add(name if name in paths else target)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[module] = {m for m in found if m in paths and m != module}
    return graph


def test_no_import_cycle_among_the_packages_modules():
    graph = module_imports()
    assert "c10d.distributed_c10d" in graph and graph["c10d.torch_backend"]
    # The package itself imports everything; a cycle through it is no cycle of the modules.
    edges = {m: graph[m] - {"c10d"} for m in graph}
    done, on_path = set(), []

    def visit(module):
        if module in on_path:
            cycle = on_path[on_path.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        on_path.append(module)
        for imported in sorted(edges[module]):
            visit(imported)
        on_path.pop()
        done.add(module)

    for module in sorted(edges):
        visit(module)
