"""A job's `selected_at` param never waits on the `select` checkpoint: its point is None until
`select` has run in this run, then the record's.

Snakemake evaluates a job's params lazily, after its input. In a rerun, a `select` that finishes
while another is running makes Snakemake build the jobs again; a job built while the running
`select` had deleted its record takes the record as a plain input, and its params, read once the
record is back, must not wait on the checkpoint (Snakemake refuses a param waiting on a checkpoint
its input does not name; CI's forget test met it). The workflow is parsed for real, with
Snakemake's own checkpoints, for which no `select` has run yet.
"""
from __future__ import annotations

from tests.plan.parsed_workflow import in_parsed_workflow

CHECK = """
from snakemake.exceptions import IncompleteCheckpointException
selected_point, selection_input = workflow.globals["selected_point"], workflow.globals["selection_input"]
out = {"before": selected_point("taft-1", 3), "input_before": selection_input("taft-1", 3)}
choice = {"shards": out["before"]["shards"], "model": "soup", "candidate": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4,
          "pt": False, "cls": True, "val_accuracy": 0.5}
Path("results/tiny/select").mkdir(parents=True)
Path("results/tiny/select/taft-1.json").write_text(json.dumps({"method": "taft-1", "choices": [choice]}))
try:
    selection_input("taft-1", 3)
    out["input_waits"] = False
except IncompleteCheckpointException:
    out["input_waits"] = True
out["while_select_runs"] = selected_point("taft-1", 3)["point"]
workflow.globals["checkpoints"].created_output.update(f"results/tiny/select/taft-1.{ext}" for ext in ("parquet", "json"))
out["input_after"] = str(selection_input("taft-1", 3)["selection"])
out["after"] = selected_point("taft-1", 3)["point"]
print(json.dumps(out))
"""


def test_the_selected_point_waits_for_select_to_run_without_raising(tmp_path):
    out = in_parsed_workflow(tmp_path, CHECK)
    # no record yet: a plain input, no point
    assert out["before"]["point"] is None and out["input_before"] == {"selection": "results/tiny/select/taft-1.json"}
    # A record on disk, no `select` of this run completed: the input waits on the checkpoint, while
    # the param leaves the point open and reads nothing (a record that `select` is to replace may
    # lack the job's choice, as after a change of `shards`).
    assert out["input_waits"] is True and out["while_select_runs"] is None
    # `select` has run in this run: the input is the record itself, and the param its point.
    assert out["input_after"] == "results/tiny/select/taft-1.json"
    assert out["after"] == {"candidate": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4, "pt": False, "cls": True}
