"""DuckDB views over everything under `results/`.

| view | source |
|---|---|
| metrics | `results/metrics/**/*.parquet` (schema in `pipeline_src/store/metrics.py`) |
| benchmarks | `results/benchmarks/**/*.parquet` (schema in `pipeline_src/store/benchmark_rows.py`) |
| models | the JSON records beside every trained/composed model (`results/{train,compose}/**/*.json`) |
| manifests | shard manifests `results/split/**/shard*.parquet` (each shard's training ids), with the file name |
| samples | `results/prepare/samples.parquet` |
| jobs | Snakemake `benchmark:` files `results/logs/**/*.bench.tsv` |
| job_counters | each job's own counters beside its log, `results/logs/**/*.counters.parquet`: images and model FLOPs (`pipeline_src/store/job_counters.py`) |
| job_rss | each job's exact peak RSS beside its log, `results/logs/**/*.rss.json`, measured by the process that reaped it (`pipeline_src/store/job_rss.py`) |
| selection | the validation search's choices `results/select/*.parquet` (schema in `pipeline_src/steps/select.py`) |
| private_selection | the DP search's choices `results/select_private/**/*.parquet` (PT per protocol, taft method, regime and ε) |
| per_image | `results/per_image/**/*.parquet`: one row per evaluated model and test image, `correct` or not (schema in `pipeline_src/store/per_image.py`), for the claims' paired tests |
| per_image_selected | `per_image` as `metrics_selected` selects `metrics` |
| metrics_selected | `metrics` where a search selected: at each searched method and N, the main DAG's rows (no `variant`) of the selected grid point only, under the searched method's name (the other points' and an off-grid base's rows left out); `metrics` itself without a search |
| environments | one row per environment fingerprint of the metrics rows (`pipeline_src/plan/environment.py`): its fields as columns, row and experiment counts, first and last time |

Views whose files do not exist yet are simply absent. `metrics` and `benchmarks` always have
every column of the current schema: files written by an older schema version (columns are only
ever added) read with NULLs in the newer columns.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline_src.store.benchmark_rows import BENCHMARK_SCHEMA
from pipeline_src.store.metrics import METRICS_SCHEMA

VIEWS = {
    "metrics": ("metrics/**/*.parquet", "SELECT * FROM read_parquet('{g}', union_by_name=true)"),
    "per_image": ("per_image/**/*.parquet", "SELECT * FROM read_parquet('{g}', union_by_name=true)"),
    "benchmarks": ("benchmarks/**/*.parquet", "SELECT * FROM read_parquet('{g}', union_by_name=true)"),
    "models": ("{train,compose}/**/*.json", None),
    "manifests": ("split/**/shard*.parquet", "SELECT * FROM read_parquet('{g}', filename=true)"),
    "samples": ("prepare/samples.parquet", "SELECT * FROM read_parquet('{g}')"),
    "jobs": ("logs/**/*.bench.tsv", "SELECT * FROM read_csv('{g}', delim='\t', header=true, filename=true, union_by_name=true)"),
    "job_counters": ("logs/**/*.counters.parquet", "SELECT * FROM read_parquet('{g}', union_by_name=true, filename=true)"),
    "job_rss": ("logs/**/*.rss.json", None),
    "selection": ("select/*.parquet", "SELECT * FROM read_parquet('{g}', union_by_name=true)"),
    "private_selection": ("select_private/**/*.parquet", "SELECT * FROM read_parquet('{g}', union_by_name=true)"),
}


SCHEMAS = {"metrics": METRICS_SCHEMA, "benchmarks": BENCHMARK_SCHEMA}

# Metrics grouped by the environment that made them; rows of schema version 1 (no fingerprint)
# form one group with NULL fields.
ENVIRONMENTS_VIEW = """CREATE OR REPLACE VIEW environments AS SELECT
    environment->>'python' AS python, environment->>'torch' AS torch, environment->>'cuda' AS cuda,
    environment->>'cudnn' AS cudnn, environment->>'timm' AS timm, environment->>'opacus' AS opacus,
    environment->>'snakemake' AS snakemake, environment->>'numpy' AS numpy,
    environment->>'commit' AS commit, CAST(environment->>'dirty' AS BOOLEAN) AS dirty,
    count(*) AS metric_rows, count(DISTINCT experiment) AS experiments,
    min(created_at) AS first_created, max(created_at) AS last_created, environment
FROM metrics GROUP BY environment"""

# The main DAG's rows as a search selected them: per searched method and N, only the selected
# candidate's rows, named after the searched method; study rows (with a `variant`) as they are.
SELECTED_VIEW = """CREATE OR REPLACE VIEW metrics_selected AS
SELECT m.* REPLACE (CASE WHEN m.variant IS NULL THEN coalesce(c.method, m.method) ELSE m.method END AS method)
FROM metrics m
LEFT JOIN (SELECT DISTINCT method, shards, candidate, selected FROM selection) c
  ON m.method = c.candidate AND m.shards = c.shards AND m.variant IS NULL
WHERE m.variant IS NOT NULL OR (coalesce(c.selected, true) AND (c.candidate IS NOT NULL OR NOT EXISTS (
    SELECT 1 FROM selection b WHERE b.method = m.method AND b.shards = m.shards)))"""


def _matches(results: Path, pattern: str) -> bool:
    patterns = [pattern.replace("{train,compose}", d) for d in ("train", "compose")] if "{" in pattern else [pattern]
    return any(glob.glob(str(results / p), recursive=True) for p in patterns)


def _create_models_table(con: duckdb.DuckDBPyConnection, files: list[str], q: str = "") -> None:
    """The `models` view: every model record, one row each, with its `filename`. The records are
    joined into one newline-delimited file first: DuckDB's `read_json_auto` over the files gives
    each its own 32 MB buffer, which ran out of memory (18.8 GB) on a 1,535-job study."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False) as out:
        for f in files:
            with open(f) as fh:
                out.write(json.dumps({**json.load(fh), "filename": f}) + "\n")
    try:
        con.execute(f"CREATE OR REPLACE TABLE {q}_models AS SELECT * FROM read_json_auto('{out.name}', "
                    "format='newline_delimited', sample_size=-1, map_inference_threshold=-1, field_appearance_threshold=0)")
    finally:
        os.unlink(out.name)
    con.execute(f"CREATE OR REPLACE VIEW {q}models AS SELECT * FROM {q}_models")  # a view, like every other kind


def _create_job_rss_table(con: duckdb.DuckDBPyConnection, files: list[str], q: str = "") -> None:
    """The `job_rss` view: one row per job's peak file, with its `filename`; read here (a few
    hundred bytes each), not by `read_json_auto`, which gives every file its own 32 MB buffer."""
    from pipeline_src.store.job_rss import read_job_rss

    rows = pa.Table.from_pylist([{"filename": f, **read_job_rss(f)} for f in files], schema=pa.schema([  # noqa: F841
        ("filename", pa.string()), ("peak_rss_mb", pa.float64()), ("peak_rss_kib", pa.int64()),
        ("measured_by", pa.string()), ("exit_code", pa.int32())]))
    con.execute(f"CREATE OR REPLACE TABLE {q}_job_rss AS SELECT * FROM rows")
    con.execute(f"CREATE OR REPLACE VIEW {q}job_rss AS SELECT * FROM {q}_job_rss")


def _benchmarks_root(study: Path) -> Path:
    """Where a study's benchmark rows are: its own `benchmarks/` when it has one, else the one
    every study shares, `results/benchmarks/` beside the study folders (`plan/studies.py`)."""
    if _matches(study, VIEWS["benchmarks"][0]) or not _matches(study.parent, VIEWS["benchmarks"][0]):
        return study
    return study.parent


def connect(results_dir: str | Path = "results", database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per kind of result file of one study's results folder
    (`results/<experiment>`; several studies: `store/studies_db.py`)."""
    con = duckdb.connect(database)
    add_views(con, results_dir)
    return con


def add_views(con: duckdb.DuckDBPyConnection, results_dir: str | Path, schema: str | None = None,
              benchmarks: bool = True) -> list[str]:
    """Create the views of one results folder in `con`; the names of those created.

    Args:
        con: the connection.
        results_dir: a study's results folder.
        schema: the (existing) schema to create them in; None: the connection's default.
        benchmarks: also the `benchmarks` view (rows shared by every study: `_benchmarks_root`).
    """
    study = Path(results_dir)
    q = f'"{schema}".' if schema else ""
    made = []
    for name, (pattern, sql) in VIEWS.items():
        if name == "benchmarks" and not benchmarks:
            continue
        results = _benchmarks_root(study) if name == "benchmarks" else study
        if not _matches(results, pattern):
            continue
        made.append(name)
        if name == "models":
            files = [f for d in ("train", "compose") for f in glob.glob(str(results / d / "**" / "*.json"), recursive=True)]
            _create_models_table(con, files, q)
        elif name == "job_rss":
            _create_job_rss_table(con, sorted(glob.glob(str(results / pattern), recursive=True)), q)
        elif name in SCHEMAS:
            # Union with an empty table of the current schema, so old files gain its new columns.
            empty = pa.Table.from_pylist([], schema=SCHEMAS[name])  # noqa: F841 (read by DuckDB)
            con.execute(f"CREATE OR REPLACE TABLE {q}_{name}_schema AS SELECT * FROM empty")
            con.execute(f"CREATE OR REPLACE VIEW {q}{name} AS " + sql.format(g=str(results / pattern))
                        + f" UNION ALL BY NAME SELECT * FROM {q}_{name}_schema")
        else:
            con.execute(f"CREATE OR REPLACE VIEW {q}{name} AS " + sql.format(g=str(results / pattern)))
    if "metrics" in made:
        con.execute(ENVIRONMENTS_VIEW.replace("VIEW environments", f"VIEW {q}environments")
                    .replace("FROM metrics", f"FROM {q}metrics"))
        made.append("environments")
        selected = (SELECTED_VIEW if "selection" in made else "CREATE OR REPLACE VIEW metrics_selected AS SELECT * FROM metrics")
        con.execute(selected.replace("VIEW metrics_selected", f"VIEW {q}metrics_selected")
                    .replace("FROM metrics", f"FROM {q}metrics").replace("FROM selection", f"FROM {q}selection"))
        made.append("metrics_selected")
    if "per_image" in made:  # selected as the metrics are: the claims pair them with `metrics_selected`
        selected = (SELECTED_VIEW if "selection" in made else "CREATE OR REPLACE VIEW metrics_selected AS SELECT * FROM metrics")
        con.execute(selected.replace("VIEW metrics_selected", f"VIEW {q}per_image_selected")
                    .replace("FROM metrics", f"FROM {q}per_image").replace("FROM selection", f"FROM {q}selection"))
        made.append("per_image_selected")
    return made
