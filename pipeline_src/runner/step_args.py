"""What a pipeline step receives: Snakemake's job object reduced to plain, picklable data.

Steps take a `StepArgs`, so they run the same from a rule's `run:` block, from a test, or
from the command line. A step reads its settings from `args.settings` (the rule's `settings`
param, `plan/step_settings.py`), or both as one job config (`StepArgs.job_config`), and how to
run from `args.runtime`. Every rule with a step is converted: `args.config` raises on any access
(a rule without settings, e.g. a test's probe, gets the whole config).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pipeline_src.plan.step_settings import converted, job_config, run_only_settings


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


class NoConfig(dict):
    """The `config` of a converted rule's job: empty, and any read raises, naming the rule, so a
    step cannot read a setting that its params (the rerun trigger) do not hold."""

    def __init__(self, rule: str) -> None:
        super().__init__()
        self.rule = rule

    def _refuse(self, *_args, **_kwargs):
        raise KeyError(f"rule '{self.rule}' reads its settings from params (args.settings, "
                       "pipeline_src/plan/step_settings.py), not from the config")

    __getitem__ = get = __contains__ = __iter__ = __len__ = keys = items = values = _refuse

    def __bool__(self) -> bool:
        self._refuse()

    def __reduce__(self):  # picklable for the fork server
        return NoConfig, (self.rule,)


class JobConfig(dict):
    """A converted rule's job config (`StepArgs.job_config`): its settings and run-only values,
    nested as in the config; reading a key that they lack raises at once, naming the rule and the
    key, so a step cannot read a setting that its params (the rerun trigger) do not hold.
    `.get(key, default)` stays dict's: it is how a step reads a key that only some of its jobs'
    settings hold (e.g. `fusion.regmean_alpha`, RegMean's only)."""

    def __init__(self, values: dict, rule: str, prefix: str = "") -> None:
        super().__init__({k: JobConfig(v, rule, f"{prefix}{k}.") if isinstance(v, dict) else v
                          for k, v in values.items()})
        self.rule, self.prefix = rule, prefix

    def __missing__(self, key: str):
        raise KeyError(f"rule '{self.rule}' reads config key '{self.prefix}{key}', which its settings lack "
                       "(RULE_KEYS in pipeline_src/plan/step_settings.py)")


@dataclass
class StepArgs:
    input: Paths = field(default_factory=Paths)
    output: Paths = field(default_factory=Paths)
    params: dict[str, Any] = field(default_factory=dict)
    wildcards: dict[str, str] = field(default_factory=dict)
    log: Paths = field(default_factory=Paths)
    threads: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # rules without settings only (else NoConfig)
    rule: str = ""  # the Snakemake rule (recorded with the job's counters)
    runtime: dict[str, Any] = field(default_factory=dict)  # plan/step_settings.RUN_ONLY: how to run, no rerun

    @property
    def settings(self) -> dict[str, Any]:
        """The job's settings: the rule's `settings` param (`plan/step_settings.settings_for`)."""
        try:
            return self.params["settings"]
        except KeyError:
            raise KeyError(f"rule '{self.rule}' has no `settings` param (plan/step_settings.py)") from None

    def job_config(self) -> dict[str, Any]:
        """The config as this job may read it: its settings with the run-only values at their keys
        (`plan/step_settings.job_config`) for a converted rule, the whole config for the others."""
        if not converted(self.rule):
            return self.config
        return JobConfig(job_config(self.settings, self.runtime), self.rule)


def _paths(named_list) -> Paths:
    names = {k: (list(v) if not isinstance(v, str) else v) for k, v in named_list.items()}
    return Paths([str(p) for p in named_list], names)


def selected_params(params: dict[str, Any], inputs: Paths) -> dict[str, Any]:
    """The params with the method that a `selected_at` param names moved, in its `settings`, to the
    point of the `selection` input (`plan/selected_point.py`): every step then trains, builds and
    records the method at the selected point. Params without `selected_at` are returned as they are.
    """
    spec = params.get("selected_at")
    if not spec:
        return params
    from pipeline_src.plan.selected_point import apply_selection, read_choice

    path = str(inputs.selection)
    settings = copy.deepcopy(params["settings"])
    methods = settings["methods"]
    methods[spec["method"]] = apply_selection(methods[spec["method"]], read_choice(path, spec), spec, path)
    return {**params, "settings": settings}


def from_job(rule: str, input, output, params, wildcards, threads: int, resources, log, config: dict) -> StepArgs:
    """Convert what a rule's `run:` block holds (Snakemake's named lists; a searched method's
    settings moved to its selected point: `selected_params`)."""
    resources = {k: v for k, v in resources.items() if isinstance(v, (int, float, str))}
    rule = str(rule or "")
    inputs = _paths(input)
    return StepArgs(
        input=inputs, output=_paths(output), params=selected_params(dict(params.items()), inputs),
        wildcards=dict(wildcards.items()), log=_paths(log), threads=int(threads),
        resources=resources, config=NoConfig(rule) if converted(rule) else dict(config), rule=rule,
        runtime=run_only_settings(config),
    )


def from_snakemake(smk) -> StepArgs:
    """Convert an object with a Snakemake job's names as attributes (a `script:`'s `snakemake`, or a
    test's namespace; `from_job`)."""
    return from_job(getattr(smk, "rule", ""), smk.input, smk.output, smk.params, smk.wildcards, smk.threads,
                    smk.resources, smk.log, smk.config)
