"""`producer_memo`: the remembered producer lookup answers as Snakemake's own does.

The reference is Snakemake's `OutputIndex.match_producers`, unpatched, on an index of the tiny
study's rules, asked for every file its dry run names (each job's inputs and outputs) and for
paths no rule makes; the patched index is asked for each twice."""
from __future__ import annotations

import json
import re

from tests.conftest import snakemake
from tests.plan.parsed_workflow import in_parsed_workflow, write_tiny_config

CHECK = """
from snakemake.output_index import OutputIndex
from pipeline_src.plan.producer_memo import remember_producers
files = json.loads(Path("files.json").read_text())
rules = list(workflow.rules)
patched = OutputIndex.match_producers  # the parse has patched it (common.smk)
OutputIndex.match_producers = patched.__wrapped__  # Snakemake's own
names = lambda found: sorted(rule.name for rule in found)
expected = {f: names(OutputIndex(rules).match_producers(f)) for f in files}
out = {"expected": expected, "first": remember_producers(), "again": remember_producers()}
index = OutputIndex(rules)
out["answers"] = [{f: names(index.match_producers(f)) for f in files} for _ in range(2)]
out["searched"] = len(index._pipeline_producers)
given = index.match_producers(files[0])
given.clear()  # a caller's change must not reach the memo
out["after_change"] = names(index.match_producers(files[0]))
print(json.dumps(out))
"""


def test_remembered_lookups_answer_as_snakemakes_for_every_file_of_a_dry_run(tmp_path):
    write_tiny_config(tmp_path)
    listed = re.findall(r"^\s+(?:input|output): (.+)$", snakemake(tmp_path, "-n").stdout, flags=re.M)
    files = sorted({f for line in listed for f in line.split(", ") if not f.startswith("<")})
    files += ["results/tiny/no_rule_makes_this.txt", "elsewhere/prepare/samples.parquet"]
    (tmp_path / "files.json").write_text(json.dumps(files))
    out = in_parsed_workflow(tmp_path, CHECK)
    expected = out["expected"]
    assert len(files) > 200 and {len(rules) for rules in expected.values()} >= {0, 1}
    assert out["first"] is True and out["again"] is False  # patched once
    assert out["answers"] == [expected, expected]
    assert out["searched"] == len(set(files))  # each file searched once
    assert out["after_change"] == expected[files[0]]
