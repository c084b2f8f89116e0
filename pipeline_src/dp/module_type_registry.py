"""A per-module-type registry decorator that refuses duplicates, as Opacus' `register_*` do.

Shared by the fast norm samplers (`norm_samplers.py`) and the book-keeping rules
(`book_keeping.py`): both map an exact module type to the function that handles it.
"""
from __future__ import annotations

from typing import Callable, TypeVar

Fn = TypeVar("Fn", bound=Callable)


def module_type_registrar(table: dict[type, Callable], what: str) -> Callable[..., Callable[[Fn], Fn]]:
    """A decorator factory `register(*module_types)` that files a function under each type in `table`.

    Args:
        table: the registry, exact module type -> function (matched by exact type, as Opacus does).
        what: what the functions are, for the duplicate error (e.g. "fast norm sampler").
    """
    def register(*module_types: type) -> Callable[[Fn], Fn]:
        def decorator(fn: Fn) -> Fn:
            for t in module_types:
                if t in table:
                    raise ValueError(f"a {what} for {t.__module__}.{t.__qualname__} is already "
                                     f"registered ({table[t].__name__}); refusing duplicate {fn.__name__}")
            for t in module_types:
                table[t] = fn
            return fn
        return decorator
    return register
