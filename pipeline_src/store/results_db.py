"""DuckDB views over everything under `results/`.

| view | source |
|---|---|
| metrics | `results/metrics/**/*.parquet` (schema in `pipeline_src/store/metrics.py`) |
| benchmarks | `results/benchmarks/**/*.parquet` (schema in `pipeline_src/store/benchmark_rows.py`) |
| models | the JSON records beside every trained/composed model (`results/{train,compose}/**/*.json`) |
| manifests | shard manifests `results/split/**/shard*.parquet` (each shard's training ids), with the file name |
| samples | `results/prepare/samples.parquet` |
| jobs | benchmark files in Snakemake's format, `results/logs/**/*.bench.tsv` (`store/job_bench.py`) |
| job_counters | each job's own counters beside its log, `results/logs/**/*.counters.parquet`: images and model FLOPs (`pipeline_src/store/job_counters.py`) |
| job_rss | each job's exact peak RSS beside its log, `results/logs/**/*.rss.json`, measured by the process that reaped it (`pipeline_src/store/job_rss.py`) |
| selection | the validation search's choices `results/select/*.parquet` (schema in `pipeline_src/steps/select.py`) |
| private_selection | the DP search's choices `results/select_private/**/*.parquet` (PT per protocol, taft method, regime and ε) |
| metrics_selected | `metrics` where a search selected: the main DAG's rows (no `variant`) of every method but the grid points (a searched method's own rows are its selected point's at every N, `plan/selected_point.py`); `metrics` itself without a search |
| per_image | `results/per_image/**/*.parquet`: one row per evaluated model and test image, `correct` or not (schema in `pipeline_src/store/per_image.py`), for the claims' paired tests |
| per_image_selected | `per_image` as `metrics_selected` selects `metrics` |
| environments | one row per environment fingerprint of the metrics rows (`pipeline_src/plan/environment.py`): its fields as columns, row and experiment counts, first and last time |

Views whose files do not exist yet are simply absent. A result file that does not read back (a
broken Parquet file or record) is named: `add_views` raises `UnreadableResults` with the file and
the command that rebuilds it, or, given `warn` (the query CLI), says so and builds the view from
the other files (`store/readable.py`, `store/check_outputs.py`). `metrics` and `benchmarks` always have
every column of the current schema: files written by an older schema version (columns are only
ever added) read with NULLs in the newer columns.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Callable

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
    "jobs": ("logs/**/*.bench.tsv", "SELECT * FROM read_csv('{g}', delim='\t', header=true, filename=true, union_by_name=true, nullstr='NA')"),
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

# The main DAG's rows as a search selected them: a searched method's own rows are its selected
# point's at every N (`plan/selected_point.py`); a grid point's rows (validated only, but a run of an
# older layout may have tested them) are left out; study rows (with a `variant`) as they are.
SELECTED_VIEW = """CREATE OR REPLACE VIEW metrics_selected AS
SELECT m.* FROM metrics m
WHERE m.variant IS NOT NULL OR m.method NOT IN (SELECT DISTINCT candidate FROM selection WHERE candidate <> method)"""


class UnreadableResults(ValueError):
    """Result files that a view would read and that do not read back."""


def _unreadable_message(view: str, results: Path, bad: dict[str, str]) -> str:
    first, why = next(iter(bad.items()))
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return (f"{len(bad)} unreadable file(s) of view '{view}' in {results}/: {first} ({why}){more}. "
            f"Rebuild them: python -m pipeline_src.store.check_outputs --results {results} --rebuild, "
            "then run the study (docs/reliability.md)")


def _readable_only(view: str, results: Path, files: list[str], warn: Callable[[str], None] | None) -> list[str]:
    """`files` less those that do not read back: named by `warn`, or raised without it.

    Raises:
        UnreadableResults: some do not, and no `warn` was given.
    """
    from pipeline_src.store.readable import unreadable

    bad = {f: why for f in files if (why := unreadable(f))}
    if bad:
        message = _unreadable_message(view, results, bad)
        if warn is None:
            raise UnreadableResults(message)
        warn(f"{message}; the view '{view}' leaves them out")
    return [f for f in files if f not in bad]


def _matches(results: Path, pattern: str) -> bool:
    patterns = [pattern.replace("{train,compose}", d) for d in ("train", "compose")] if "{" in pattern else [pattern]
    return any(glob.glob(str(results / p), recursive=True) for p in patterns)


def _create_models_table(con: duckdb.DuckDBPyConnection, files: list[str], q: str = "",
                         readable: Callable[[list[str]], list[str]] | None = None) -> None:
    """The `models` view: every model record, one row each, with its `filename`. The records are
    joined into one newline-delimited file first: DuckDB's `read_json_auto` over the files gives
    each its own 32 MB buffer, which ran out of memory (18.8 GB) on a 1,535-job study."""
    import json
    import tempfile

    records = {}
    for f in files:
        try:
            records[f] = json.loads(Path(f).read_bytes())
        except ValueError:
            if readable is None:
                raise
            readable([f])  # names the broken record: raises, or warns and it is left out
    with tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False) as out:
        for f, record in records.items():
            out.write(json.dumps({**record, "filename": f}) + "\n")
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


def connect(results_dir: str | Path = "results", database: str = ":memory:",
            warn: Callable[[str], None] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per kind of result file of one study's results folder
    (`results/<experiment>`; several studies: `store/studies_db.py`).

    Args:
        results_dir: the study's results folder.
        database: DuckDB's database (default: in memory).
        warn: as `add_views`' (None: a file that does not read back raises `UnreadableResults`).
    """
    con = duckdb.connect(database)
    add_views(con, results_dir, warn=warn)
    return con


# Views of a row per model, metric or job: small whatever the dataset (not `per_image`, `samples`
# or `manifests`, a row per image or sample).
SNAPSHOT_VIEWS = ("metrics", "jobs", "job_counters", "selection", "private_selection")


def snapshot(con: duckdb.DuckDBPyConnection, names: tuple[str, ...] = SNAPSHOT_VIEWS) -> list[str]:
    """Copy these views' rows into tables once, under the views' names (the views built on them,
    such as `metrics_selected`, follow), so that later queries read memory instead of every file
    again, and all of them see the same files. The report ran ~80 queries over them, each reading
    and (for the jobs' TSV files) sniffing every file again (docs/performance.md). Returns the names copied.

    Args:
        con: a connection from `connect` (views in its default schema).
        names: the views to copy; those the connection lacks are skipped.
    """
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    copied = [n for n in names if n in views]
    for name in copied:
        con.execute(f"CREATE TABLE _snapshot_{name} AS SELECT * FROM {name}")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _snapshot_{name}")
    return copied


def _source(sql: str, files: list[str] | None, glob_pattern: str) -> str:
    """A view's SELECT over its glob, or over these files only (the readable ones)."""
    if files is None:
        return sql.format(g=glob_pattern)
    return sql.replace("'{g}'", "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]")


def add_views(con: duckdb.DuckDBPyConnection, results_dir: str | Path, schema: str | None = None,
              benchmarks: bool = True, warn: Callable[[str], None] | None = None) -> list[str]:
    """Create the views of one results folder in `con`; the names of those created.

    Args:
        con: the connection.
        results_dir: a study's results folder.
        schema: the (existing) schema to create them in; None: the connection's default.
        benchmarks: also the `benchmarks` view (rows shared by every study: `_benchmarks_root`).
        warn: called with a message naming files that do not read back, which the views then
            leave out; None: raise instead.
    Raises:
        UnreadableResults: a file of a view does not read back (without `warn`).
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
            _create_models_table(con, files, q, lambda fs, n=name, r=results: _readable_only(n, r, fs, warn))
            continue
        if name == "job_rss":
            _create_job_rss_table(con, sorted(glob.glob(str(results / pattern), recursive=True)), q)
            continue
        if name in SCHEMAS:
            # Union with an empty table of the current schema, so old files gain its new columns.
            empty = pa.Table.from_pylist([], schema=SCHEMAS[name])  # noqa: F841 (read by DuckDB)
            con.execute(f"CREATE OR REPLACE TABLE {q}_{name}_schema AS SELECT * FROM empty")
        tail = f" UNION ALL BY NAME SELECT * FROM {q}_{name}_schema" if name in SCHEMAS else ""
        try:
            con.execute(f"CREATE OR REPLACE VIEW {q}{name} AS " + _source(sql, None, str(results / pattern)) + tail)
        except duckdb.Error:  # DuckDB reads the files' footers here: one broken file stops the view
            files = sorted(glob.glob(str(results / pattern), recursive=True))
            readable = _readable_only(name, results, files, warn)
            if len(readable) == len(files):
                raise  # not a broken file: DuckDB's own error
            if not readable:
                made.remove(name)
                continue
            con.execute(f"CREATE OR REPLACE VIEW {q}{name} AS " + _source(sql, readable, "") + tail)
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
