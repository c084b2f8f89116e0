"""Run any SQL over the results views (see `pipeline_src/store/results_db.py`) of one study, or of
several side by side (`pipeline_src/store/studies_db.py`; the layout: docs/studies.md).

    python -m pipeline_src.store.query "SELECT method, shards, model, avg(value) FROM metrics
                                  WHERE metric = 'accuracy' GROUP BY ALL ORDER BY ALL"
    python -m pipeline_src.store.query --study fashion-far --format csv "SELECT * FROM models" > models.csv
    python -m pipeline_src.store.query --configfile my_study.yaml --views   # list views and their columns
    python -m pipeline_src.store.query --all-studies "SELECT experiment, method, avg(value) FROM metrics
                                  WHERE metric = 'accuracy' GROUP BY ALL"   # or --studies a,b
    python -m pipeline_src.store.query --compare digits-transfer fashion-far claims   # a report table side by side

The study is the one named by --study, else the `experiment` of --configfile, else config.yaml's.
"""
from __future__ import annotations

import argparse
import os
import sys

from pipeline_src.plan.studies import RESULTS, resolve_study
from pipeline_src.store.results_db import connect
from pipeline_src.store.studies_db import compare_tables, connect_studies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sql", nargs="?", help="the query")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--study", help="the study's name (its experiment): results/<study>")
    which.add_argument("--configfile", help="a study's config: the study named by its experiment")
    which.add_argument("--results", help="a study's results folder, given as a path")
    which.add_argument("--all-studies", action="store_true",
                       help="every study under --root: each view holds every study's rows, with an `experiment` "
                            "column; each study's own views are in a schema of its name")
    which.add_argument("--studies", metavar="A,B", help="these studies (comma-separated), as --all-studies")
    which.add_argument("--compare", nargs=3, metavar=("STUDY_A", "STUDY_B", "TABLE"),
                       help="one report table (report/<TABLE>.csv: claims, table1_methods, ...) of two studies side by side")
    parser.add_argument("--root", default=RESULTS, help=f"the folder of every study (default: {RESULTS})")
    parser.add_argument("--format", choices=["table", "csv", "md"], default="table")
    parser.add_argument("--views", action="store_true", help="list the available views and their columns")
    ns = parser.parse_args(argv)
    if ns.compare:
        return _print(compare_tables(ns.root, *ns.compare), ns.format)
    if not ns.views and not ns.sql:
        parser.error("give a SQL query or --views")
    if ns.all_studies or ns.studies:
        con = connect_studies(ns.root, ns.studies.split(",") if ns.studies else None, warn=_warn)
        where = ns.root
    else:
        where = str(ns.results or resolve_study(ns.study, ns.configfile, ns.root))
        if not os.path.isdir(where):
            print(f"query: no results folder at {os.path.abspath(where)} (run the study first, or give "
                  "--study, --configfile or --results)", file=sys.stderr)
            return 1
        con = connect(where, warn=_warn)  # a broken file is named, and the other files still answer
    if ns.views:
        try:
            for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
                                       "ORDER BY 1").fetchall():
                cols = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
                print(f"{name}: {', '.join(cols)}")
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
        return 0
    try:
        rel = con.sql(ns.sql)
    except Exception as e:  # duckdb raises many error types; show the message, not a traceback
        print(f"query failed: {e} (results folder: {os.path.abspath(where)})", file=sys.stderr)
        return 1
    if rel is None:
        return 0
    return _print(rel.df(), ns.format)


def _warn(message: str) -> None:
    print(f"query: warning: {message}", file=sys.stderr)


def _print(df, fmt: str) -> int:
    """Print a result table in `fmt` (table, csv or md); 0."""
    try:
        if fmt == "csv":
            df.to_csv(sys.stdout, index=False)
        elif fmt == "md":
            print(df.to_markdown(index=False))
        else:
            print(df.to_string(index=False))
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    return 0


def _quiet_stdout() -> None:
    """The reader of a pipe (`| head`) stopped reading: what it took is what it wanted. Point
    stdout at /dev/null so that Python's flush at exit raises nothing either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
