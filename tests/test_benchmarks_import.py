"""Every name a benchmark script imports from pipeline_src exists (the scripts run rarely, so a
moved function would otherwise break them silently)."""
from __future__ import annotations

import ast
import importlib

from tests.conftest import REPO


def test_benchmark_imports_resolve():
    missing = []
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline_src"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{script.name}: {node.module}.{alias.name}")
    assert missing == []
