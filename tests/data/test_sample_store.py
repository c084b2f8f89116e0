"""The samples table is held as Arrow columns (issue 25): lookups equal a Python-dict reference on
a table whose rows are not in position order, an unknown id is named, and opening a large table
allocates no Python object per row."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_src.data.sample_store import SampleStore
from pipeline_src.plan.samples import SAMPLES_SCHEMA


def samples_file(tmp_path, n: int):
    rng = np.random.default_rng(0)
    rows = rng.permutation(n)  # `row` is not the table position
    table = pa.table({"sample_id": [f"digits/{i % 7}/{i:07d}" for i in range(n)], "row": rows,
                      "task": np.where(np.arange(n) % 3 == 0, "source", "target"),
                      "split": rng.choice(["train", "val", "test"], n), "label": np.arange(n) % 5,
                      "class_name": [str(i % 5) for i in range(n)]}, schema=SAMPLES_SCHEMA)
    pq.write_table(table, tmp_path / "samples.parquet")
    return tmp_path / "samples.parquet", table.to_pydict()


def test_lookups_equal_a_python_reference(tmp_path):
    path, t = samples_file(tmp_path, 500)
    store = SampleStore(path)
    row_of = dict(zip(t["sample_id"], t["row"]))
    label_of = dict(zip(t["sample_id"], t["label"]))
    ids = store.ids("target", "test")
    assert ids == sorted(i for i, tk, s in zip(t["sample_id"], t["task"], t["split"]) if tk == "target" and s == "test")
    query = ids[::-1] + ids[:3]  # any order, repeats
    assert store.rows(query).tolist() == [row_of[i] for i in query]
    sub = store.subset(query)
    assert sub.rows.tolist() == [row_of[i] for i in query] and sub.labels.tolist() == [label_of[i] for i in query]
    assert store.num_classes("target") == 5 and store.rows([]).shape == (0,)
    with pytest.raises(KeyError, match="sample id not in the prepared dataset: digits/nope"):
        store.rows([ids[0], "digits/nope"])


def test_opening_a_large_table_holds_no_python_object_per_row(tmp_path):
    path, _ = samples_file(tmp_path, 200_000)
    tracemalloc.start()
    store = SampleStore(path)
    rows = store.rows(["digits/3/0000003", "digits/2/0199999"])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows.tolist() == [int(store._rows[3]), int(store._rows[199_999])]
    assert held < 1 << 20  # the id -> row dict of before: 27 MB of Python objects here
