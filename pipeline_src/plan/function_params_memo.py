"""Snakemake's look at a rule function's parameters, remembered per function.

Before Snakemake 9 calls an input, params or resource function of a job, it asks
`get_function_params(func)` which arguments the function takes (`wildcards`, `input`,
`threads`, `attempt`, ...), twice per call (once for `groupid`, once for the rest), and that
is `inspect.signature(func)` afresh each time. The cold Fashion dry run (995 jobs) made 14,843
such inspections of a few dozen functions (docs/performance.md).

A function's parameters do not change, so this patch keeps each answer. The answer is
`Signature.parameters`, a read-only mapping, so every caller may share it. A function that
carries Snakemake's own override (`_overwrite_params`, set by `subpath` and `prepend_param`)
keeps being answered by it, as Snakemake does.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

_PATCHED = "_pipeline_remembered"
# The modules that call it by the name they imported (`from snakemake.common import ...`).
_USERS = ("snakemake.common", "snakemake.rules", "snakemake.jobs")


def remember_function_params() -> bool:
    """Patch `get_function_params` where Snakemake's rules and jobs call it, so each function is
    inspected once. Returns whether it patched: False where this Snakemake has no such function
    (another version: left alone) or it is patched already."""
    import importlib

    try:
        modules = [importlib.import_module(name) for name in _USERS]
    except ImportError:
        return False
    original = getattr(modules[0], "get_function_params", None)
    override = getattr(modules[0], "FUNC_OVERWRITE_PARAMS_ATTR", None)
    if original is None or override is None or getattr(original, _PATCHED, False):
        return False
    memo: dict[Any, Mapping[str, inspect.Parameter]] = {}  # the parsed rules' functions, a few per rule

    def get_function_params(func: Callable) -> Mapping[str, Any]:
        if hasattr(func, override):  # Snakemake's own answer for this function, as before
            return getattr(func, override)
        try:
            return memo[func]
        except KeyError:
            pass
        except TypeError:  # unhashable: ask afresh, as before
            return original(func)
        found = memo[func] = original(func)
        return found

    setattr(get_function_params, _PATCHED, True)
    get_function_params.__wrapped__ = original
    get_function_params.memo = memo  # type: ignore[attr-defined]  (read by its test)
    for module in modules:
        if getattr(module, "get_function_params", None) is original:
            module.get_function_params = get_function_params
    return True
