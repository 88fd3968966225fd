"""The package's import graph: no cycles (lazy imports included), no private names across modules, layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("hdmm", "census_workloads")

#: Lower layers first: a module may import from its own layer or below, never above.
LAYERS = [
    {"hdmm.version", "hdmm.validation", "hdmm.labels", "hdmm.spectral", "hdmm.slq", "hdmm.columns", "hdmm.records",
     "hdmm.domain", "hdmm.noise", "hdmm.files", "hdmm.distributions", "hdmm.threads"},
    {"hdmm.matrix", "hdmm.kron_union", "hdmm.marginals", "hdmm.residual_bases", "hdmm.workload",
     "hdmm.block_diagonal"},
    {"hdmm.calibration", "hdmm.privacy", "hdmm.structure"},
    {"hdmm.budget", "hdmm.ledger"},
    {"hdmm.traces", "hdmm.union_gram"},
    {"hdmm.geography"},
    {"hdmm.error", "hdmm.bound", "hdmm.bound_rows", "hdmm.mechanism", "hdmm.query_variances"},
    {"hdmm.optimizers", "hdmm.strategies"},
    {"hdmm.io", "hdmm.exact"},
    {"hdmm.planning"},
    {"hdmm.kernel", "hdmm.postprocess"},
    {"hdmm.release"},
    {"hdmm.georelease"},
    {"hdmm.cli_inputs"},
    {"hdmm.cli_geography"},
    {"hdmm.cli"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str]]:
    """``(module imported, name imported)`` pairs of every import in the file, in functions too."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.append((full if full in MODULES else target, alias.name))
        elif isinstance(node, ast.Import):
            out.extend((alias.name, "") for alias in node.names)
    return [(t, n) for t, n in out if t.split(".")[0] in PACKAGES]


def _edges() -> dict[str, set[str]]:
    return {name: {t for t, _ in _imports(name, path) if t in MODULES and t != name} for name, path in MODULES.items()}


def test_no_import_cycles():
    edges = _edges()
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if nxt == "hdmm" or (node == "hdmm" and nxt.startswith("hdmm.")):
                continue  # the package's __init__ re-exports: not a dependency of its modules
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for start in sorted(MODULES):
        if start not in state:
            visit(start, [start])


def test_modules_do_not_import_the_package_itself():
    offenders = [name for name, path in MODULES.items() if name.startswith("hdmm.")
                 and any(t == "hdmm" for t, _ in _imports(name, path))]
    assert not offenders, f"modules importing from the hdmm package namespace (a cycle through __init__): {offenders}"


def test_no_private_name_is_imported_from_another_module():
    found = [(name, target, imported) for name, path in MODULES.items() for target, imported in _imports(name, path)
             if imported.startswith("_") and target != name]
    assert not found, f"private names imported across modules: {found}"


def _layer(name: str) -> int | None:
    for level, members in enumerate(LAYERS):
        if any(name == m or name.startswith(m + ".") for m in members):
            return level
    return None


def test_no_lower_layer_imports_a_higher_one():
    found = []
    for name, targets in _edges().items():
        own = _layer(name)
        if own is None:
            continue
        for target in targets:
            level = _layer(target)
            if level is not None and level > own:
                found.append(f"{name} (layer {own}) imports {target} (layer {level})")
    assert not found, "\n".join(found)


def _mentions_noise(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr == "noise") or (isinstance(n, ast.Name) and "noise" in n.id)
               for n in ast.walk(node))


def _is_text(node: ast.AST) -> bool:
    if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
        return bool(node.elts) and all(_is_text(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_the_noise_kind_and_the_privacy_class_are_asked_not_compared():
    """Noise is an object (hdmm.distributions) and composition a Privacy method: no name or class compared."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_text(s) for s in sides) and any(_mentions_noise(s) for s in sides):
                    found.append(f"{name}:{node.lineno}: a noise compared with its name")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                kinds = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if len(node.args) == 2 else set()
                if kinds & {"PureDP", "ApproxDP", "ZCDP"}:
                    found.append(f"{name}:{node.lineno}: isinstance on a privacy class (use its composition methods)")
    assert not found, "\n".join(found)
