"""The package's imports follow docs/architecture.md: no cycle among ctrkit's modules nor among its parts (packages
and top-level modules; function-level imports count, annotations-only ones under ``if TYPE_CHECKING`` do not), and
each part imports only what the page's table allows."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ctrkit"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports(path: Path) -> set[str]:
    """The ctrkit modules ``path`` imports anywhere in it (a ``from pkg import name`` of a submodule names it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ctrkit"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("ctrkit"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(MODULES)
            found |= subs or {node.module}
    return {m for m in found if m in MODULES} - {module_name(path)}


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def part_of(module: str) -> str:
    """``data/`` for ctrkit.data.x, ``metrics.py`` for ctrkit.metrics (the names the architecture page uses)."""
    parts = module.split(".")
    return f"{parts[1]}/" if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def rules() -> dict[str, set[str]]:
    """The architecture page's table: each part -> the parts it may import (itself always)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("<!-- import rules -->")[1].split("<!-- end import rules -->")[0]
    out = {}
    for line in table.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            continue
        allowed = set(re.findall(r"`([^`]+)`", cells[1]))
        for part in re.findall(r"`([^`]+)`", cells[0]):
            out[part] = allowed | {part}
    return out


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(GRAPH) == []


def test_no_part_imports_one_that_imports_it_back():
    """The same at the level of the page's parts (``train/``, ``eval/``, ``checkpoint.py``, ...)."""
    parts: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        if module != "ctrkit":
            here = part_of(module)
            parts.setdefault(here, set()).update(part_of(t) for t in targets if t != "ctrkit" and part_of(t) != here)
    assert cycles(parts) == []


def test_each_part_imports_only_what_the_architecture_page_allows():
    table = rules()
    every = {part_of(m) for m in GRAPH if m != "ctrkit"}
    assert every - set(table) == set(), "parts the architecture page's import rules do not cover"
    assert set(table) - every == set(), "rules for parts the package does not have"
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target != "ctrkit" and part_of(module) in table and part_of(target) not in table[part_of(module)]
    )
    assert wrong == []


def test_the_checks_find_what_they_look_for():
    """The checks themselves, on a made-up graph and on this package: a cycle is found, an upward import is seen."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "ctrkit.data.feature_spec" in GRAPH["ctrkit.data.dataset"]  # module-level imports are read
    assert "ctrkit.models.registry" in GRAPH["ctrkit.train.run"]
    lazy = [m for m, p in MODULES.items() if "    from ctrkit." in p.read_text()]
    assert lazy and all(GRAPH[m] for m in lazy)  # function-level imports are read
    assert part_of("ctrkit.data.atomic") == "data/" and part_of("ctrkit.metrics") == "metrics.py"
    assert "ctrkit.checkpoint" not in GRAPH["ctrkit.checkpoint_shards"]  # its import is annotations-only


def test_commands_and_a_plans_models_leave_torch_dynamo_unimported():
    """torch._dynamo takes over a second to import: the CLI, the serving and scoring modules and every model built
    on the meta device (as the plan builds it) must not import it; torch.compile, exports and torch's optimizers
    do, when they are used."""
    import subprocess
    import sys

    code = """
import sys
import torch
import ctrkit.cli, ctrkit.cli.train, ctrkit.cli.serve, ctrkit.serve.server, ctrkit.eval.evaluator
from ctrkit.models.registry import create_model, list_models, make_config
for name in list_models():
    cfg = make_config(name, {"num_numerical": 3, "cardinalities": [5, 7], "dynamic_features": [1]})
    with torch.device("meta"):
        create_model(name, cfg)
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
