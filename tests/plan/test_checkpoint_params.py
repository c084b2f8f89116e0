"""A job's `selected_at` param reads the `select` record on disk, whatever the checkpoint's state.

Snakemake evaluates a job's params lazily, after its input. In a rerun, a `select` that finishes
while another is running makes Snakemake build the jobs again; a job built while the running
`select` had deleted its record takes the record as a plain input, and its params, read once the
record is back, must not ask the checkpoint (Snakemake refuses a param waiting on a checkpoint
its input does not name; CI's forget test met it). The workflow is parsed for real, in this
process, with Snakemake's own checkpoints, for which no `select` has run yet.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from snakemake.api import SnakemakeApi
from snakemake.exceptions import IncompleteCheckpointException
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

from tests.conftest import REPO


@pytest.fixture
def workflow_globals(tmp_path, monkeypatch) -> dict:
    """The parsed tiny study's Snakefile namespace, in `tmp_path`."""
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["device"] = "cpu"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=1), storage_settings=StorageSettings(),
                          config_settings=ConfigSettings(configfiles=[tmp_path / "config.yaml"]),
                          snakefile=REPO / "Snakefile", workdir=tmp_path)
        yield wf._workflow.globals


def test_the_selected_point_is_read_from_the_record_while_its_checkpoint_has_not_run(workflow_globals, tmp_path):
    selected_point, selection_input = workflow_globals["selected_point"], workflow_globals["selection_input"]
    spec = selected_point("taft-1", 3)
    assert spec["point"] is None  # no record yet: a plain input, no point
    assert selection_input("taft-1", 3) == {"selection": "results/tiny/select/taft-1.json"}

    choice = {"shards": spec["shards"], "model": "soup", "candidate": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4,
              "pt": False, "cls": True, "val_accuracy": 0.5}
    record = tmp_path / "results/tiny/select/taft-1.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"method": "taft-1", "choices": [choice]}))

    # The input goes through the checkpoint, which no `select` of this run has completed...
    with pytest.raises(IncompleteCheckpointException):
        selection_input("taft-1", 3)
    # ...while the param reads the record as it is.
    point = selected_point("taft-1", 3)["point"]
    assert point == {"candidate": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4, "pt": False, "cls": True}

    # Once `select` has run in this run, the input is the record itself, and the param is the same.
    workflow_globals["checkpoints"].created_output.update(f"results/tiny/select/taft-1.{ext}" for ext in ("parquet", "json"))
    assert str(selection_input("taft-1", 3)["selection"]) == "results/tiny/select/taft-1.json"
    assert selected_point("taft-1", 3)["point"] == point
