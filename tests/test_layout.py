"""The package's shape: no import circles (deferred imports included), and the public API
is what the package root exports."""

from __future__ import annotations

import ast
from pathlib import Path

import grammarmask as gm

PACKAGE = Path(gm.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The grammarmask modules `path` imports anywhere in its body (a deferred import is an
    import too: it only hides a circle until run time)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module in modules and module != name}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(files)
    graph = {name: _imports(path, modules) for name, path in files.items()}
    for name in modules:  # importing a module imports its packages first
        parent = name.rpartition(".")[0]
        while parent:
            if parent != name:
                graph[name].add(parent)
            parent = parent.rpartition(".")[0]
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle through modules (a package importing its own submodules from its
    __init__ is not one), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if node.startswith(nxt + "."):  # a submodule "imports" its package
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"gm.a": {"gm.b"}, "gm.b": {"gm.c"}, "gm.c": {"gm.a"}, "gm": set()}
    assert _cycle(graph) == ["gm.a", "gm.b", "gm.c", "gm.a"]


def test_the_root_exports_exist_and_are_documented() -> None:
    assert gm.__version__.count(".") == 2
    for name in gm.__all__:
        value = getattr(gm, name)
        if callable(value) and not name.isupper():
            assert (value.__doc__ or "").strip(), f"gm.{name} has no docstring"


def test_every_exception_class_lives_in_errors() -> None:
    homes = {
        f"{_module_name(path)}.{node.name}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(base, ast.Name) and base.id.endswith(("Error", "Exception", "Fault"))
            for base in node.bases
        )
    }
    assert homes and all(home.startswith("grammarmask.errors.") for home in homes), homes


LAYERS = (
    ("grammarmask.errors",),
    ("grammarmask.schema",),
    ("grammarmask.grammars", "grammarmask.vocabulary", "grammarmask.resources"),
    ("grammarmask.backends",),
    ("grammarmask.compile_cache", "grammarmask.compiler", "grammarmask.masks"),
    ("grammarmask.device",),
    ("grammarmask.pool",),
    ("grammarmask.integrations",),
    ("grammarmask.tools", "grammarmask.__main__"),
)
"""The package's layers, lowest first: a module imports only from its own layer and the
ones below it (the package root, which re-exports the public API, sits above them all)."""


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return len(LAYERS)  # the package root


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in _graph() if m != "grammarmask" and _layer(m) == len(LAYERS)]
    assert not unplaced, unplaced


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` that run from a layer up to a higher one."""
    return sorted(
        f"{module} ({_layer(module)}) -> {target} ({_layer(target)})"
        for module, targets in graph.items()
        for target in targets
        if target != "grammarmask" and _layer(target) > _layer(module)
    )


def test_no_import_runs_up_a_layer() -> None:
    upward = _upward(_graph())
    assert not upward, "\n".join(upward)


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {
        "grammarmask.device.kernels": {"grammarmask.pool.plan", "grammarmask.masks"},
        "grammarmask.schema.walk": {"grammarmask.grammars"},
    }
    assert _upward(graph) == [
        "grammarmask.device.kernels (5) -> grammarmask.pool.plan (6)",
        "grammarmask.schema.walk (1) -> grammarmask.grammars (2)",
    ]
