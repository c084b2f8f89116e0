"""The LAST memory claim compares tensors counted as Table 7 counts them, where records carry them."""
import json

from tests.reports.test_claims import FULL, accuracy_rows, claims_of, write_study

CLAIM = "LAST ≥ FC at ≤ 25 % of full fine-tuning's memory"


def add_counted(results, method: str, train_mem_mb: float) -> None:
    path = results / "train" / method / "n1_s0" / "shard0.json"
    rec = json.loads(path.read_text())
    path.write_text(json.dumps(rec | {"train_mem_mb": train_mem_mb, "activations_mb": 1.0}))


def test_counted_training_memory_replaces_the_process_peak(tmp_path):
    # process peaks say 96 % (mostly torch itself); the counted tensors say 10 %
    results = write_study(tmp_path, accuracy_rows(FULL, {}), memory={"last": 960.0, "full": 1000.0})
    add_counted(results, "last", 2.5)
    add_counted(results, "full", 25.0)
    claim = claims_of(results, tmp_path / "report")[CLAIM]
    assert claim["this study's figure"].endswith("memory 2.5 MB = 10 % of full's 25.0 MB")
    assert claim["holds"] == "yes"
    assert "saved activations" in claim["note"]


def test_process_peak_stays_where_one_record_lacks_the_count(tmp_path):
    results = write_study(tmp_path, accuracy_rows(FULL, {}), memory={"last": 960.0, "full": 1000.0})
    add_counted(results, "last", 2.5)  # full's record predates the count
    claim = claims_of(results, tmp_path / "report")[CLAIM]
    assert claim["this study's figure"].endswith("memory 960 MB = 96 % of full's 1000 MB")
    assert claim["holds"] == "no"
    assert "process peak RSS" in claim["note"]
