"""The package's import graph: no cycles (lazy imports inside functions count too), a layering
contract between its packages, and a parse-time `plan` that imports no torch (issue 13)."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "pipeline_src"

# What each package may import besides itself. `plan` is the bottom layer (parse time, no
# torch), then `store`, `data`, and the job-time layers on top. The algorithm libraries stand
# alone, like timm and Opacus: they import one another but nothing of the pipeline (issue 24).
# Leaf modules import nothing of the package and have their own entry, so the parse-time
# `plan` may use them: `methods.kinds` (per-kind facts, torch-free), `store.atomic` and
# `optim.schedule` (the LR schedule, pure arithmetic: `plan` checks `train.schedule` with it);
# `job` (glibc allocator control, work counters) serves every job-time layer.
LEAVES = ("methods.kinds", "store.atomic", "optim.schedule", "job")
LIBRARIES = {"taft", "last", "dp", "matching", "fusion", "optim", "vit"}
ALLOWED: dict[str, set[str]] = {
    "methods.kinds": set(),
    "store.atomic": set(),
    "optim.schedule": set(),
    "job": set(),  # allocator control and work counters, used by every layer's batch loops
    "plan": {"methods.kinds", "store.atomic", "optim.schedule"},
    "store": {"plan", "methods.kinds", "job"},
    "data": {"plan", "store", "job"},
    **{lib: set(LIBRARIES) | {"job"} for lib in LIBRARIES},
    "methods": {"plan", "store", "data", "methods.kinds", "job"} | LIBRARIES,
    "runner": {"plan", "store", "job"},  # plan.step_settings: which config a job is handed
    "reports": {"plan", "store"},
    "steps": {"plan", "store", "data", "methods", "methods.kinds", "runner", "reports", "job"} | LIBRARIES,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """Every pipeline_src module `path` imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        out |= {n for n in names if n.startswith("pipeline_src") and n in known}
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(p, known) - {m} for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")[1:]
    if not parts:
        return None
    return ".".join(parts[:2]) if ".".join(parts[:2]) in LEAVES else parts[0]


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_layering_contract():
    bad = []
    for mod, deps in graph().items():
        src = layer(mod)
        if src is None:
            continue
        assert src in ALLOWED, f"{mod}: package '{src}' has no entry in ALLOWED"
        allowed = ALLOWED[src] | {src}
        for dep in sorted(deps):
            dst = layer(dep)
            if dst is not None and dst not in allowed and dst.split(".")[0] not in allowed:
                bad.append(f"{mod} -> {dep}")
    assert bad == [], "imports across the layering contract (tests/test_imports.py ALLOWED):\n" + "\n".join(bad)


def test_libraries_import_nothing_of_the_pipeline():
    """taft/, last/, dp/, matching/, fusion/, optim/ and vit/ import only one another and the
    `job` leaf (and torch, timm, Opacus, numpy, scipy): no `plan`, `store`, `data`, `methods`,
    `runner`, `reports` or `steps`, whether at module level or inside a function."""
    bad = [f"{mod} -> {dep}" for mod, deps in graph().items() if layer(mod) in LIBRARIES
           for dep in sorted(deps) if layer(dep).split(".")[0] not in LIBRARIES | {"job"}]
    assert bad == [], "a library imports the pipeline:\n" + "\n".join(bad)


def test_every_package_has_an_entry():
    """A new package must be placed in the contract (a library, or a layer with its allowed imports)."""
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
    assert [p for p in packages if p not in ALLOWED] == []


def test_every_top_level_module_has_a_package():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert top == [], f"modules outside the layered packages: {top}"


def test_plan_imports_no_torch():
    """Building the DAG (the rules import only pipeline_src.plan) loads no torch, timm or sklearn."""
    code = ("import sys, importlib, pkgutil, pipeline_src.plan as p\n"
            "for m in pkgutil.iter_modules(p.__path__): importlib.import_module(f'pipeline_src.plan.{m.name}')\n"
            "print(sorted(k for k in ('torch', 'timm', 'sklearn', 'opacus') if k in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_cold_dry_run_imports_no_torch(tmp_path):
    """`snakemake -n` of the default study in a fresh interpreter and a fresh results folder (no
    plan cache: the privacy budgets are checked, with plan/rdp_accountant.py) loads no torch, timm,
    Opacus or scikit-learn: they cost seconds of every parse (issue 24)."""
    # pandas too (0.25 CPU-s through pyarrow's shim, plan/arrow_tables.py), unless the Slurm executor
    # plugin is installed: Snakemake imports it at each start, and it imports pandas itself
    slurm = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
    heavy = ('torch', 'timm', 'opacus', 'sklearn') + (() if slurm else ('pandas',))
    code = ("import sys\nfrom snakemake.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            f"print(sorted(k for k in {heavy!r} if k in sys.modules))")
    args = ["-n", "-q", "-s", str(REPO / "Snakefile"), "--configfile", str(REPO / "config.yaml"),
            "--directory", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # no plan cache in a fresh folder, and a dry run writes none (issue 33): every check ran cold
    assert not (tmp_path / "results").exists()
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_the_query_cli_imports_no_torch():
    """Querying results (DuckDB over Parquet) starts in a fraction of a second: no torch."""
    code = ("import sys, pipeline_src.store.query, pipeline_src.store.results_db\n"
            "print(sorted(k for k in ('torch', 'timm', 'opacus') if k in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# Besides: the rules' `run:` blocks call the job launcher, imported when a job runs, and Ctrl-C's
# handler (both torch-free: test_a_cold_dry_run_imports_no_torch).
RULE_RUNNER_IMPORTS = ("pipeline_src.runner.launch", "pipeline_src.runner.job_stops")


def test_rules_import_only_parse_time_modules():
    """The Snakefile and rules import only `plan`, the per-kind facts (`methods.kinds`) and the launcher."""
    rules = sorted((REPO / "workflow" / "rules").glob("*.smk")) + [REPO / "Snakefile"]
    bad = []
    for f in rules:
        for line in f.read_text().splitlines():
            s = line.strip()
            if s.startswith(("from pipeline_src", "import pipeline_src")) and not s.split()[1].startswith(("pipeline_src.plan", "pipeline_src.methods.kinds", *RULE_RUNNER_IMPORTS)):
                bad.append(f"{f.name}: {s}")
    assert bad == []


def _kind_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a method's kind: `kind == ...`, `cfg["kind"] in ...`, `ctx.kind != ...`."""
    def is_kind(node):
        return ((isinstance(node, ast.Name) and node.id == "kind")
                or (isinstance(node, ast.Attribute) and node.attr == "kind")
                or (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "kind"))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare) and is_kind(n.left)
            and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in n.ops)]


def test_kind_branches_only_in_methods():
    """Per-kind behaviour lives in methods/ (methods/kinds.py holds the facts the rest asks)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG).parts[0] != "methods":
            bad += [f"{path.relative_to(REPO)}:{line}" for line in _kind_comparisons(ast.parse(path.read_text()))]
    for path in sorted((REPO / "workflow").rglob("*.smk")) + [REPO / "Snakefile"]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"""(\bkind\b|\[["']kind["']\])\s*(==|!=|in\b|not\s+in\b)""", code):
                bad.append(f"{path.relative_to(REPO)}:{i}")
    assert bad == [], "branch on kind_of(...) facts from pipeline_src/methods/kinds.py instead: " + ", ".join(bad)


def test_every_imported_name_exists():
    """`from pipeline_src.x import name` (lazy ones inside functions too) names something x has:
    a function moved by the relayout must not leave an import that fails only when its code path runs."""
    import importlib

    known = modules()
    missing = []
    for mod, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pipeline_src")):
                continue
            target = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(target, alias.name) and f"{node.module}.{alias.name}" not in known:
                    missing.append(f"{mod}:{node.lineno}: {node.module}.{alias.name}")
    assert missing == []
