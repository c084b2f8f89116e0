"""What a pipeline step receives: Snakemake's job object reduced to plain, picklable data.

Steps take a `StepArgs`, so they run the same from a Snakemake `script:`, from a test, or
from the command line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Paths(list):
    """A list of paths that also allows access by the rule's names (`args.output.model`)."""

    def __init__(self, items=(), names: dict[str, Any] | None = None) -> None:
        super().__init__(items)
        self._names = dict(names or {})

    def __getattribute__(self, name: str) -> Any:
        # Rule names win over list methods, so an output may be called `index` or `count`.
        names = super().__getattribute__("__dict__").get("_names", {})
        if name in names:
            return names[name]
        return super().__getattribute__(name)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_names"][name]
        except KeyError:
            raise AttributeError(f"no input/output named '{name}'") from None


@dataclass
class StepArgs:
    input: Paths = field(default_factory=Paths)
    output: Paths = field(default_factory=Paths)
    params: dict[str, Any] = field(default_factory=dict)
    wildcards: dict[str, str] = field(default_factory=dict)
    log: Paths = field(default_factory=Paths)
    threads: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    rule: str = ""  # the Snakemake rule (recorded with the job's counters)


def _paths(named_list) -> Paths:
    names = {k: (list(v) if not isinstance(v, str) else v) for k, v in named_list.items()}
    return Paths([str(p) for p in named_list], names)


def from_snakemake(smk) -> StepArgs:
    """Convert the `snakemake` object a `script:` receives."""
    resources = {k: v for k, v in smk.resources.items() if isinstance(v, (int, float, str))}
    return StepArgs(
        input=_paths(smk.input), output=_paths(smk.output), params=dict(smk.params.items()),
        wildcards=dict(smk.wildcards.items()), log=_paths(smk.log), threads=int(smk.threads),
        resources=resources, config=dict(smk.config), rule=str(getattr(smk, "rule", "") or ""),
    )
