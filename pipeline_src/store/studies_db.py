"""Queries across studies: DuckDB views over several `results/<experiment>/` folders, and two
studies' report tables side by side (`plan/studies.py` has the layout).

`connect_studies` gives, for every kind of view of `store/results_db.py`, one view over every
study's rows (each row carries its `experiment`: the metrics rows their own, other views get the
study's name), plus each study's own views in a schema of its name (`"tiny".metrics`; `schema_of`
has the rule for names DuckDB cannot take as they are), and `studies`: each study's schema.
`compare_tables` joins one report table (`report/<table>.csv`) of two studies on its key columns.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import duckdb
import pyarrow as pa

from pipeline_src.plan.studies import RESULTS, list_studies
from pipeline_src.store.results_db import VIEWS, _matches, add_views

# DuckDB's own schemas: a study of one of these names gets a prefixed schema.
RESERVED = {"main", "temp", "system", "information_schema", "pg_catalog"}
PREFIX = "study_"
# The columns that name a row of a report table (the rest are the study's figures): claims.csv's
# (`reports/claims.py`); other tables (Table 1, 2, ...) are keyed by their first column.
KEYS = {"claims": ["claim", "paper", "paper table/figure", "paper's figure"]}


def schema_of(study: str) -> str:
    """The schema of a study's own views: its name, unique and from the name alone.

    DuckDB's names ignore case, and a few are its own. So a capital letter is written as `^` and
    the letter (`Tiny` -> `^tiny`: beside `tiny`, never a study's name, as `^` is in none), and a
    name that is DuckDB's own or starts with `study_` gets `study_` in front (`main` ->
    `study_main`, `study_main` -> `study_study_main`). Lower-case names stay as they are.
    """
    marked = "".join(f"^{c.lower()}" if c.isupper() else c for c in study)
    return PREFIX + marked if marked in RESERVED or marked.startswith(PREFIX) else marked


def connect_studies(root: str | Path = RESULTS, studies: list[str] | None = None,
                    warn: Callable[[str], None] | None = None) -> duckdb.DuckDBPyConnection:
    """A connection whose views hold every study's rows, each with an `experiment` column.

    Args:
        root: the folder of all studies.
        studies: the studies' names (default: every study under `root`).
        warn: as `results_db.add_views`' (None: a file that does not read back raises).
    Raises:
        SystemExit: a named study is missing, or there is none.
    """
    root = Path(root)
    there = list_studies(root)
    studies = studies or there
    missing = [s for s in studies if s not in there]
    if missing or not studies:
        raise SystemExit(f"no stud{'y' if len(missing) == 1 else 'ies'} {', '.join(missing) or ''} under {root}/ "
                         f"(there: {', '.join(there) or 'none'})")
    con = duckdb.connect()
    made: dict[str, list[str]] = {}
    for study in studies:
        con.execute(f'CREATE SCHEMA "{schema_of(study)}"')
        for view in add_views(con, root / study, schema_of(study), benchmarks=False, warn=warn):
            made.setdefault(view, []).append(study)
    for view, owners in made.items():
        parts = []
        for study in owners:
            cols = {r[0] for r in con.execute(f'DESCRIBE "{schema_of(study)}".{view}').fetchall()}
            label = "" if "experiment" in cols else f"'{study}' AS experiment, "
            parts.append(f'SELECT {label}* FROM "{schema_of(study)}".{view}')
        con.execute(f"CREATE VIEW main.{view} AS " + " UNION ALL BY NAME ".join(parts))
    _add_benchmarks(con, root)  # results/benchmarks/: the machine's rows, shared by every study
    schemas = pa.table({"experiment": studies, "schema": [schema_of(s) for s in studies]})  # noqa: F841 (DuckDB reads it)
    con.execute("CREATE TABLE main._studies AS SELECT * FROM schemas")
    con.execute("CREATE VIEW main.studies AS SELECT * FROM main._studies")
    return con


def _add_benchmarks(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """The shared `benchmarks` view (rows of `benchmarks/*.py`, not of one study)."""
    if not _matches(folder, VIEWS["benchmarks"][0]):
        return
    pattern, sql = VIEWS["benchmarks"]
    con.execute("CREATE VIEW main.benchmarks AS " + sql.format(g=str(folder / pattern)))


def compare_tables(root: str | Path, a: str, b: str, table: str, on: list[str] | None = None):
    """Two studies' report table side by side: its key columns, then each other column once per
    study (`<column> [<study>]`). Rows one study lacks have empty cells on its side.

    Args:
        root: the folder of all studies.
        a, b: the studies' names.
        table: a report table's name: `report/<table>.csv` of each study (claims, table1_methods, ...).
        on: the key columns (default: `KEYS`, else the table's first column).
    Raises:
        SystemExit: a study has no such table, or the key columns are not in both.
    Returns:
        a pandas DataFrame.
    """
    import pandas as pd  # here: the query CLI's other paths start without it
    frames = []
    for study in (a, b):
        path = Path(root) / study / "report" / f"{table}.csv"
        if not path.is_file():
            tables = sorted(p.stem for p in path.parent.glob("*.csv"))
            raise SystemExit(f"study '{study}' has no report table '{table}' ({path}); its tables: "
                             f"{', '.join(tables) or 'none (run its report first)'}")
        frames.append(pd.read_csv(path))
    keys = on or KEYS.get(table) or [frames[0].columns[0]]
    for study, df in zip((a, b), frames):
        absent = [k for k in keys if k not in df.columns]
        if absent:
            raise SystemExit(f"report table '{table}' of study '{study}' has no column {absent[0]!r} "
                             f"(columns: {', '.join(df.columns)})")
    # A key repeated within a table (one claim per N, say) pairs its rows in order.
    for df in frames:
        df["#"] = df.groupby(keys, dropna=False).cumcount()
    left, right = (df.rename(columns={c: f"{c} [{s}]" for c in df.columns if c not in keys + ["#"]})
                   for s, df in zip((a, b), frames))
    both = left.merge(right, on=keys + ["#"], how="outer", sort=False).drop(columns="#")
    values = [c for c in frames[0].columns.union(frames[1].columns, sort=False) if c not in keys + ["#"]]
    order = keys + [f"{c} [{s}]" for c in values for s in (a, b) if f"{c} [{s}]" in both.columns]
    return both[order]
