"""The layers of `rl360cli/` and the rules its imports obey (docs/architecture.md draws them).

An AST walk over every module, function-level imports included and `if TYPE_CHECKING:` blocks left
out (they never run), gives the import graph; the tests below fail on:
- a circle between parts, or between modules;
- an import of a layer above (the CLI, then the stages, the run, the loop, rollouts, trainers and the
  demo, the session / sandboxes / inference / backends, the floor at the bottom);
- a config module (`config.py`, `configload.py`, any part's `config.py`) importing more than other
  config modules and the errors: configs sit in the floor, so any layer may read any part's
  configuration without importing the part;
- the RL core (`rl360cli/rl/`) importing Ray, an HTTP client, the state file, stages, commands,
  backends, sandboxes, engines, trainers or the loop;
- a package `__init__` importing rl360cli modules (importing a part's config must load nothing else);
- a private name (`_x`) imported from another module;
- a toy task in the trainer package.
The walker is checked on small synthetic trees first, so a rule that cannot fail shows up here.
"""

from __future__ import annotations

import ast
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rl360cli"

CONFIGS = "configs"
# Top to bottom; a part may import its own layer (without a circle) and the layers below.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("CLI", frozenset({"cli", "__main__", "commands"})),
    ("stages", frozenset({"stages"})),
    ("run", frozenset({"run"})),
    ("loop", frozenset({"loop"})),
    # The demo's tiny policy is sized by the trainer's `ModelConfig`; the trainer never imports the demo.
    ("rollouts, trainers, the demo", frozenset({"rollout", "trainer", "demo"})),
    ("session, sandboxes, inference, backends", frozenset({"agent", "sandbox", "inference", "backends", "nodes",
                                                            "images"})),
    ("floor", frozenset({"rl", CONFIGS, "state", "events", "errors", "outcome", "ports", "metrics", "progress",
                         "logview", "procinfo", "supervise", "rl360cli"})),
)
RL_CORE_MAY_IMPORT = frozenset({"rl", CONFIGS, "outcome", "errors"})
RL_CORE_FORBIDDEN_LIBRARIES = frozenset({"ray", "aiohttp", "requests", "httpx", "urllib3", "urllib", "http",
                                         "socket", "docker", "paramiko", "submitit", "wandb", "sglang"})
CONFIG_MAY_IMPORT = frozenset({CONFIGS, "errors"})


@dataclass
class Graph:
    """Modules of a package and what each imports: rl360cli modules (`edges`, and `on_import`, those
    imported when the module itself is, outside functions) and other top-level names (`libraries`)."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    on_import: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    libraries: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # `from rl360cli.x import _name`: a private name taken from another module.
    private: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """`rl360cli.sandbox.waves` -> `sandbox`; every config module -> `configs`."""
    names = module.split(".")
    if names[-1] in ("config", "configload"):
        return CONFIGS
    return names[1] if len(names) > 1 else names[0]


def layer_of(part: str) -> int:
    for index, (_, parts) in enumerate(LAYERS):
        if part in parts:
            return index
    raise AssertionError(f"part {part!r} is in no layer: add it to LAYERS (and to docs/architecture.md)")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, in_function: bool = False):
    """(import statement, whether it sits in a function) for every import that can run, nested ones
    included, skipping `if TYPE_CHECKING:` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), in_function)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        yield from _imports(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def build_graph(root: Path) -> Graph:
    graph = Graph()
    for path in sorted(root.rglob("*.py")):
        graph.modules[module_name(path, root)] = path
    top = root.name
    for module, path in graph.modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, in_function in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                prefix = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{prefix}.{alias.name}" for alias in node.names]
                if prefix.split(".")[0] == top:
                    graph.private[module] |= {f"{prefix}.{a.name}" for a in node.names
                                              if a.name.startswith("_") and not a.name.startswith("__")}
            for target in targets:
                if target.split(".")[0] != top:
                    graph.libraries[module].add(target.split(".")[0])
                    continue
                # `from pkg import mod` imports the module; `from mod import name` the module holding it.
                while target not in graph.modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in graph.modules and target != module:
                    graph.edges[module].add(target)
                    if not in_function:
                        graph.on_import[module].add(target)
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def part_edges(graph: Graph) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.edges.items():
        for target in targets:
            if part_of(module) != part_of(target):
                out[part_of(module)].add(part_of(target))
    return out


def violations(graph: Graph) -> list[str]:
    """Every broken rule of the module docstring, one line each (empty: the package obeys them all)."""
    problems = [f"modules in a circle: {' -> '.join(c)}" for c in cycles(graph.edges)]
    problems += [f"parts in a circle: {' -> '.join(c)}" for c in cycles(part_edges(graph))]
    for module, targets in sorted(graph.edges.items()):
        source = part_of(module)
        for target in sorted(targets):
            into = part_of(target)
            if layer_of(into) < layer_of(source):
                problems.append(f"{module} ({LAYERS[layer_of(source)][0]}) imports {target}, "
                                f"a layer above ({LAYERS[layer_of(into)][0]})")
            if source == CONFIGS and into not in CONFIG_MAY_IMPORT:
                problems.append(f"config module {module} imports {target}: configs import only configs and errors")
            if source == "rl" and into not in RL_CORE_MAY_IMPORT:
                problems.append(f"the RL core's {module} imports {target}")
            if graph.modules[module].name == "__init__.py" and target in graph.on_import[module]:
                problems.append(f"package {module} imports {target} in its __init__")
    for module, names in sorted(graph.private.items()):
        problems += [f"{module} imports the private {name}" for name in sorted(names)]
    for module, libraries in sorted(graph.libraries.items()):
        if part_of(module) == "rl":
            forbidden = sorted(libraries & RL_CORE_FORBIDDEN_LIBRARIES)
            problems += [f"the RL core's {module} imports {lib}" for lib in forbidden]
    return problems


# ----------------------------------------------------------------------------- the walker on synthetic trees


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "rl360cli"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_walker_sees_function_level_and_relative_imports_but_not_type_checking(tmp_path):
    root = _tree(tmp_path, {
        "rl/__init__.py": "", "rl/grpo.py": "import numpy\n",
        "rl/batch.py": """
            from typing import TYPE_CHECKING
            from .grpo import x
            if TYPE_CHECKING:
                from rl360cli.state import StateFile
            def f():
                from rl360cli import metrics
            """,
        "state.py": "", "metrics.py": "",
    })
    graph = build_graph(root)
    assert graph.edges["rl360cli.rl.batch"] == {"rl360cli.rl.grpo", "rl360cli.metrics"}
    assert graph.libraries["rl360cli.rl.grpo"] == {"numpy"}


def test_each_rule_can_fail(tmp_path):
    root = _tree(tmp_path, {
        "stages/__init__.py": "", "stages/run.py": "from rl360cli.loop import driver\n",
        "loop/__init__.py": "", "loop/driver.py": "def f():\n    from rl360cli.stages import run\n",
        "loop/config.py": "from rl360cli.loop import driver\n",
        "rl/__init__.py": "from rl360cli.rl import grpo\n", "rl/grpo.py": "import ray\nfrom rl360cli import state\n",
        "state.py": "def _lock(): pass\n", "events.py": "from rl360cli.state import _lock\n",
    })
    found = "\n".join(violations(build_graph(root)))
    assert "modules in a circle: rl360cli.loop.driver -> rl360cli.stages.run" in found
    assert "parts in a circle: loop -> stages" in found
    assert "rl360cli.loop.driver (loop) imports rl360cli.stages.run, a layer above (stages)" in found
    assert "config module rl360cli.loop.config imports rl360cli.loop.driver" in found
    assert "the RL core's rl360cli.rl.grpo imports ray" in found
    assert "the RL core's rl360cli.rl.grpo imports rl360cli.state" in found
    assert "package rl360cli.rl imports rl360cli.rl.grpo in its __init__" in found
    assert "rl360cli.events imports the private rl360cli.state._lock" in found


def test_a_clean_tree_has_no_violations(tmp_path):
    root = _tree(tmp_path, {
        "stages/__init__.py": "", "stages/run.py": "from rl360cli.loop import driver\nfrom rl360cli import state\n",
        "loop/__init__.py": "", "loop/driver.py": "from rl360cli.loop.config import LoopConfig\n",
        "loop/config.py": "from rl360cli.errors import E\n", "errors.py": "", "state.py": "",
    })
    assert violations(build_graph(root)) == []


def test_a_part_outside_the_layers_is_named():
    with pytest.raises(AssertionError, match="part 'newpart' is in no layer"):
        layer_of("newpart")


# ----------------------------------------------------------------------------- the package itself


def test_rl360cli_obeys_its_layers():
    problems = violations(build_graph(PACKAGE))
    assert not problems, "\n".join(problems)


def test_the_trainer_package_holds_no_toy_task():
    """Trainers, the weight sync and model loading only: a task family lives in rl360cli/demo/, and the
    trainer never imports it (policy v0 is built where the two meet, rl360cli/run/policy.py)."""
    demo_modules = {p.stem for p in (PACKAGE / "demo").glob("*.py")} - {"__init__"}
    trainer_modules = {p.stem for p in (PACKAGE / "trainer").glob("*.py")}
    assert demo_modules and not demo_modules & trainer_modules
    mentions = [p.name for p in (PACKAGE / "trainer").glob("*.py") if "arith" in p.read_text()]
    assert not mentions, f"trainer modules that know the arith task: {mentions}"
    graph = build_graph(PACKAGE)
    into_demo = sorted(f"{m} imports {t}" for m, ts in graph.edges.items() for t in ts
                       if part_of(m) == "trainer" and part_of(t) == "demo")
    assert not into_demo, f"the trainer imports the demo: {into_demo}"


def test_the_docs_name_every_part():
    """README's layout and docs/architecture.md's table keep up with the tree."""
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for name in packages:
        assert f"{name}/" in layout, f"README's layout lacks rl360cli/{name}/"
        assert f"`{name}/`" in architecture, f"docs/architecture.md lacks rl360cli/{name}/"
        layer_of(name)
