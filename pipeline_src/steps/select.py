"""select: the validation search's choice for one searched method (TAFT App. A, Tables 4-6).

Reads the `validate` rows of every candidate (its grid points, `plan/search.py`) and, per shard
count N, picks the point with the highest validation accuracy averaged over seeds; a tie goes to
the first point in grid order. It reads validation rows only: its inputs are the files under
`results/validate/`, and a row of any other split is refused, naming its file. Writes
`results/select/<method>.parquet` (one row per N and candidate, `selected` marking the choice)
and `<method>.json` (the choices).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_parquet, write_text

SELECTION_SCHEMA = pa.schema([
    ("experiment", pa.string()),
    ("method", pa.string()),  # the searched method
    ("kind", pa.string()),
    ("k", pa.int64()),
    ("shards", pa.int64()),
    ("model", pa.string()),  # what was compared: shard (N = 1), soup or ensemble
    ("candidate", pa.string()),  # the grid point's method name
    ("lr", pa.float64()),
    ("pt", pa.bool_()),
    ("cls", pa.bool_()),
    ("protocol", pa.string()),  # a DP search's selection (`select_private`): its DP jobs; else null
    ("regime", pa.string()),
    ("epsilon", pa.float64()),
    ("val_accuracy", pa.float64()),  # mean over seeds
    ("seeds", pa.int64()),
    ("selected", pa.bool_()),
])


def read_validation(paths: Sequence[str]) -> list[dict]:
    """The accuracy rows of the validation files: {method, shards, model, seed, value}.

    Raises:
        ValueError: a row of a split other than val, naming its file.
    """
    rows = []
    for path in paths:
        table = pq.read_table(path, columns=["method", "model", "shards", "seed", "split", "metric", "value"])
        for row in table.to_pylist():
            if row["split"] != "val":
                raise ValueError(f"select: {path} holds a row of split '{row['split']}'; "
                                 "selection reads validation rows only")
            if row["metric"] == "accuracy":
                rows.append(row)
    return rows


def choose(rows: list[dict], candidates: list[dict], method: str, experiment: str) -> list[dict]:
    """One selection row per N and candidate (`SELECTION_SCHEMA`), the best mean validation
    accuracy `selected` (ties: grid order).

    Args:
        rows: validation accuracy rows (`read_validation`).
        candidates: the grid points, {name, lr, pt, cls}, in grid order.
        method: the searched method's name.
        experiment: the study's name, recorded in each row.

    Raises:
        ValueError: a candidate without validation rows at an N where others have them.
    """
    by_point: dict[tuple[int, str], list[float]] = {}
    models: dict[int, str] = {}
    for r in rows:
        by_point.setdefault((int(r["shards"]), r["method"]), []).append(float(r["value"]))
        models[int(r["shards"])] = r["model"]
    out = []
    for n in sorted(models):
        lacking = [c["name"] for c in candidates if (n, c["name"]) not in by_point]
        if lacking:
            raise ValueError(f"select: no validation rows of {', '.join(lacking)} at N = {n} ({method}'s search)")
        means = [sum(by_point[n, c["name"]]) / len(by_point[n, c["name"]]) for c in candidates]
        best = max(range(len(candidates)), key=lambda i: (means[i], -i))
        out += [dict(experiment=experiment, method=method, kind=c.get("kind"), k=c.get("k"), shards=n,
                     model=models[n], candidate=c["name"],
                     lr=float(c["lr"]), pt=c.get("pt"), cls=c.get("cls"), val_accuracy=means[i],
                     seeds=len(by_point[n, c["name"]]), selected=i == best)
                for i, c in enumerate(candidates)]
    return out


def main(args: StepArgs) -> None:
    method, candidates = args.wildcards["method"], args.params["candidates"]
    rows = choose(read_validation(list(args.input.validation)), candidates, method, args.settings["experiment"])
    labels = args.params.get("labels") or {}  # select_private: protocol, regime, epsilon
    rows = [{**r, **labels} for r in rows]
    write_parquet(pa.Table.from_pylist(rows, schema=SELECTION_SCHEMA), args.output.choice)
    chosen = [{k: r[k] for k in ("shards", "model", "candidate", "lr", "pt", "cls", "val_accuracy")}
              for r in rows if r["selected"]]
    write_text(json.dumps({"method": method, "choices": chosen}, indent=1) + "\n", Path(args.output.record))
    for c in chosen:
        print(f"{method} N = {c['shards']}: {c['candidate']} (val {c['val_accuracy']:.4f})")
