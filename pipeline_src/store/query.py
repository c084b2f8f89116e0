"""Run any SQL over the results views (see `pipeline_src/store/results_db.py`).

    python -m pipeline_src.store.query "SELECT method, shards, model, avg(value) FROM metrics
                                  WHERE metric = 'accuracy' GROUP BY ALL ORDER BY ALL"
    python -m pipeline_src.store.query --format csv "SELECT * FROM models" > models.csv
    python -m pipeline_src.store.query --views     # list views and their columns
"""
from __future__ import annotations

import argparse
import os
import sys

from pipeline_src.store.results_db import connect


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sql", nargs="?", help="the query")
    parser.add_argument("--results", default="results", help="results folder (default: results)")
    parser.add_argument("--format", choices=["table", "csv", "md"], default="table")
    parser.add_argument("--views", action="store_true", help="list the available views and their columns")
    ns = parser.parse_args(argv)
    if not ns.views and not ns.sql:
        parser.error("give a SQL query or --views")
    if not os.path.isdir(ns.results):
        print(f"query: no results folder at {os.path.abspath(ns.results)} (run the study first, or give "
              "--results)", file=sys.stderr)
        return 1
    con = connect(ns.results)
    if ns.views:
        try:
            for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall():
                cols = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
                print(f"{name}: {', '.join(cols)}")
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
        return 0
    try:
        rel = con.sql(ns.sql)
    except Exception as e:  # duckdb raises many error types; show the message, not a traceback
        print(f"query failed: {e} (results folder: {os.path.abspath(ns.results)})", file=sys.stderr)
        return 1
    if rel is None:
        return 0
    df = rel.df()
    try:
        if ns.format == "csv":
            df.to_csv(sys.stdout, index=False)
        elif ns.format == "md":
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
