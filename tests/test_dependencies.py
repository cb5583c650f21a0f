"""Dependencies point one way (docs/architecture.md): read every module's imports with `ast`
(function-level imports included) and check the package layers and the absence of cycles."""

import ast
import collections
from pathlib import Path

import jaxrl_llm

ROOT = Path(jaxrl_llm.__file__).parent
# Building blocks never reach up into the stages that assemble them.
LOWER = {"algorithms", "models", "sharding", "rewards", "tools", "data"}
UPPER = {"learner", "rollout", "metrics", "bench"}


def _module_name(path: Path) -> str:
    parts = ["jaxrl_llm", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """module -> the jaxrl_llm modules it imports (a name imported from a package counts as
    its submodule when it is one)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxrl_llm"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    graph[name].add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in modules)
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_lower_packages_never_import_the_stages_above_them():
    wrong = sorted(
        f"{src} imports {dst}"
        for src, dsts in _import_graph().items()
        for dst in dsts
        if _package(src) in LOWER and _package(dst) in UPPER
    )
    assert wrong == []


def test_no_import_cycles_between_modules():
    graph = _import_graph()
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_checker_sees_function_level_imports():
    """The rollout stage imports the engine inside a function; the graph must still see it."""
    graph = _import_graph()
    assert "jaxrl_llm.rollout" in graph["jaxrl_llm.rollout.stage"]
    assert "jaxrl_llm.learner.rl_config" in graph["jaxrl_llm.config"]
