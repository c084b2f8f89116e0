"""One claims table over several studies (regimes), a column each, ordered by measured distance.

    python -m pipeline_src.reports.cross_regime results/fashion-near results/fashion-far --out results/regimes

Each argument is a study's results folder (its metrics, records and, where it searched, its
selections). Per study: its claims (`reports/claims.py`, methods from the trained records), its
measured regime (NLFT-1 − FC of the full-data models, `reports/regimes.py`) and the paper's
rows at that distance. Writes `claims_by_regime.md` (a column per study, nearest first, then the
paper's rows at each distance and each study's selected points) and `claims_by_regime.csv` (one
row per study and claim).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from pipeline_src.reports import claim_rows
from pipeline_src.reports.claims import study_claims
from pipeline_src.reports.regimes import PAPER_ROWS, Regime, measured_regime
from pipeline_src.store.atomic import write_text
from pipeline_src.store.results_db import connect


def study_summary(results_dir: Path) -> tuple[str, Regime, pd.DataFrame, pd.DataFrame]:
    """(experiment, regime, claims, selected points) of one study's results folder.

    Raises:
        ValueError: a folder without metrics.
    """
    con = connect(results_dir)
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    if "metrics" not in views:
        raise ValueError(f"cross_regime: {results_dir} holds no metrics (results/metrics/**/*.parquet)")
    names = [r[0] for r in con.sql("SELECT DISTINCT experiment FROM metrics WHERE experiment IS NOT NULL AND kind <> 'pretrain' "
                                   "ORDER BY 1").fetchall()]
    experiment = ", ".join(names) or results_dir.name
    methods = claim_rows.recorded_methods(con)
    regime = measured_regime(claim_rows.accuracy_rows(con), methods)
    claims = pd.DataFrame([vars(c) for c in study_claims(con, methods)])
    selected = (con.sql("SELECT method, shards AS N, candidate AS selected, lr AS LR, pt AS PT, cls AS CLS, "
                        "val_accuracy FROM selection WHERE selected ORDER BY method, shards").df()
                if "selection" in views else pd.DataFrame())
    return experiment, regime, claims, selected


def rows_by_setting(claims: list[str]) -> tuple[list[str], dict[str, str]]:
    """The table's rows: a claim that one study names bare (its n/a row: it ran none of the jobs)
    and another per setting (`<claim>, N = 10`, `<claim>: last, ...`) becomes the per-setting rows,
    in the bare row's place, so each regime's cell sits on its setting's row.

    Returns:
        (the rows in order, each per-setting row's bare claim).
    """
    per_setting = {c: b for b in claims for c in claims if c.startswith((f"{b}, ", f"{b}: "))}
    order: list[str] = []
    for c in claims:
        group = [s for s in claims if per_setting.get(s) == c] or ([] if c in per_setting else [c])
        order += [s for s in group if s not in order]
    return order, per_setting


def bare_claim(claim: str, per_setting: dict[str, str]) -> str:
    """The bare claim a per-setting row belongs to (itself when it has none)."""
    return per_setting.get(claim, claim)


def _order(summaries: list[tuple[Path, tuple]]) -> list[tuple[Path, tuple]]:
    """Nearest first (smallest NLFT-1 − FC); studies without a measured gap last."""
    return sorted(summaries, key=lambda s: (s[1][1].gap_pts is None, s[1][1].gap_pts or 0.0))


def cross_regime_report(results_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Write `claims_by_regime.{md,csv}` for two or more studies' results folders.

    Args:
        results_dirs: each study's results folder (`results/<experiment>`).
        out_dir: where the two files go (created).
    """
    if len(results_dirs) < 2:
        raise ValueError("cross_regime: give two or more studies' results folders")
    studies = _order([(Path(d), study_summary(Path(d))) for d in results_dirs])
    long = []
    for path, (experiment, regime, claims, _) in studies:
        for _, c in claims.iterrows():
            long.append({"study": experiment, "results_dir": str(path), "regime": regime.name,
                         "nlft1_minus_fc_pts": regime.gap_pts, "claim": c.claim, "paper": c.paper,
                         "paper_made_it_for": c.paper_regime, "paper_rows": c.paper_rows,
                         "study_figure": c.study_figure, "holds": c.holds})
    df = pd.DataFrame(long)
    columns = [f"{e}: {r.label()}" for _, (e, r, _, _) in studies]
    order, per_setting = rows_by_setting(list(dict.fromkeys(df.claim)))
    wide = pd.DataFrame({"claim": order, "paper made it for": [df[df.claim.isin([c, bare_claim(c, per_setting)])]
                                                               .paper_made_it_for.iloc[0] for c in order]})
    for col, (_, (e, _, _, _)) in zip(columns, studies):
        cells = {r.claim: f"**{r.holds}**: {r.study_figure}" for r in df[df.study == e].itertuples()}
        wide[col] = [cells.get(c, cells.get(bare_claim(c, per_setting), "— (no such rows)")) for c in order]
    text = ["# Claims by regime", "", "Studies, nearest first (measured distance: NLFT-1 − FC of the full-data "
            "models, selected points where the study searched; `pipeline_src/reports/regimes.py`):", ""]
    text += [f"- `{e}` ({p}): {r.label()}" for p, (e, r, _, _) in studies]
    text += ["", wide.to_markdown(index=False), "", "## The paper's rows at each study's distance", ""]
    for _, (e, r, _, _) in studies:
        text.append(f"- `{e}` ({r.name}):")
        for key, (made_for, rows) in PAPER_ROWS.items():
            quoted = rows.get(r.name) or "; ".join(f"{g}: {x}" for g, x in rows.items())
            text.append(f"  - {key} (made for {made_for}): {quoted}")
    text += ["", "## Selected points (validation search)", ""]
    for _, (e, _, _, selected) in studies:
        text += [f"`{e}`:", "", selected.to_markdown(index=False, floatfmt=".4f") if len(selected)
                 else "(no search)", ""]
    out_dir.mkdir(parents=True, exist_ok=True)
    md, csv = out_dir / "claims_by_regime.md", out_dir / "claims_by_regime.csv"
    write_text("\n".join(text) + "\n", md)
    write_text(df.to_csv(index=False), csv)
    return [md, csv]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dirs", nargs="+", type=Path, help="two or more studies' results folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for claims_by_regime.{md,csv}")
    args = parser.parse_args(argv)
    try:
        paths = cross_regime_report(args.results_dirs, args.out)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
