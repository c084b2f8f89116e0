"""report: run every report over the DuckDB views of `results/`."""
from __future__ import annotations

from pathlib import Path

from pipeline_src.reports.report import REPORTS, WITH_CONFIG
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_text
from pipeline_src.store.results_db import connect


def main(args: StepArgs) -> None:
    out_dir = Path(args.output.reports)
    out_dir.mkdir(parents=True, exist_ok=True)
    con = connect(args.params["results_dir"])
    lines = ["# Reports", ""]
    for name, report in REPORTS.items():
        paths = report(con, out_dir, config=args.settings) if name in WITH_CONFIG else report(con, out_dir)
        for path in paths:
            print(f"{name}: wrote {path}")
            lines.append(f"- {name}: [{path.name}]({path.name})")
    write_text("\n".join(lines) + "\n", out_dir / "index.md")
