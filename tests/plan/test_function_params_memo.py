"""`function_params_memo`: the remembered parameters answer as Snakemake's own look does.

The reference is `inspect.signature(func).parameters` (Snakemake's `get_function_params`,
unpatched), for every input, params and resource function of the tiny study's parsed rules,
each asked twice; and Snakemake's override attribute wins over the memo, as it does unpatched."""
from __future__ import annotations

from tests.plan.parsed_workflow import in_parsed_workflow

CHECK = """
import inspect
import snakemake.common, snakemake.jobs, snakemake.rules
from pipeline_src.plan.function_params_memo import remember_function_params
patched = snakemake.rules.get_function_params  # the parse has patched it (common.smk)
funcs = []
for rule in workflow.rules:
    for items in (rule.input, rule.params):
        for item in items:
            func = getattr(getattr(item, "_file", None), "callable", None) or getattr(item, "callable", None) or item
            if callable(func):
                funcs.append(func)
    funcs += [res.evaluate for res in rule.resources.values()]  # bound methods, a new one per access
names = lambda params: list(params)
out = {"patched_everywhere": [m.get_function_params is patched for m in (snakemake.common, snakemake.jobs, snakemake.rules)],
       "again": remember_function_params(), "funcs": len(funcs), "mismatch": [], "memo_before": len(patched.memo)}
for func in funcs:
    for _ in range(2):
        if names(patched(func)) != names(inspect.signature(func).parameters):
            out["mismatch"].append(repr(func))
out["memo_grew_by"] = len(patched.memo) - out["memo_before"]
out["distinct"] = len(set(funcs))
def forced(wildcards, input): pass
patched(forced)
snakemake.common.overwrite_function_params(forced, ["wildcards"])
out["override"] = list(patched(forced))
class Unhashable:
    __hash__ = None
    def __call__(self, wildcards, threads): pass
out["unhashable"] = list(patched(Unhashable()))
print(json.dumps(out))
"""


def test_remembered_params_answer_as_inspect_does_for_every_rule_function(tmp_path):
    out = in_parsed_workflow(tmp_path, CHECK)
    assert out["patched_everywhere"] == [True, True, True] and out["again"] is False  # patched once
    assert out["funcs"] > 50 and out["mismatch"] == []
    assert out["memo_grew_by"] <= out["distinct"]  # one entry per function, however often asked
    assert out["override"] == ["wildcards"]  # Snakemake's own override still wins
    assert out["unhashable"] == ["wildcards", "threads"]
