"""report: run every report over the DuckDB views of `results/`."""
from __future__ import annotations

from pathlib import Path

from pipeline_src.reports.report import REPORTS, WITH_CONFIG
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_text
from pipeline_src.store.results_db import connect, snapshot

# The report's first line: it counts images, times jobs and shows non-DP results, so no DP
# guarantee covers it; a DP study's releasable folder is `release/` (docs/privacy.md).
PRIVATE_NOTICE = ("PRIVATE WORKSPACE: not releasable, even in a DP study (it counts images, times jobs and shows "
                  "non-DP results); the releasable folder of a DP study is its release/, beside this report (docs/privacy.md).")


def index_text(entries: list[str]) -> str:
    """index.md: the private-workspace notice, then one line per report file."""
    return "\n".join([PRIVATE_NOTICE, "", "# Reports", "", *entries]) + "\n"


def main(args: StepArgs) -> None:
    out_dir = Path(args.output.reports)
    out_dir.mkdir(parents=True, exist_ok=True)
    con = connect(args.params["results_dir"])
    snapshot(con)  # the small views read once: every report then sees the same files
    lines = []
    for name, report in REPORTS.items():
        paths = report(con, out_dir, config=args.settings) if name in WITH_CONFIG else report(con, out_dir)
        for path in paths:
            print(f"{name}: wrote {path}")
            lines.append(f"- {name}: [{path.name}]({path.name})")
    write_text(index_text(lines), out_dir / "index.md")
