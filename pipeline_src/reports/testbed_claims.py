"""The testbed's premise, tested as a claim: is the pretrained backbone worth fine-tuning?

The papers fine-tune ImageNet backbones that beat training from scratch on their targets. A study
whose no-pretraining references (`baselines.*`: pixel logistic regression, the small CNN; and any
method with `init: random`, the same architecture from scratch) beat its fine-tuned models can
neither confirm nor refute the papers with force (issue 42 §3). Two rows test the premise:

- **FC above every no-pretraining reference**: the linear probe, the backbone's features as they
  are (the near regime's goal).
- **The val-best fine-tuned method above every reference** (the far regime's goal): "best" by
  the validation accuracy of its selected point at N = 1 (the `selection` view), never by test
  (it may be FC itself); n/a without a search. The rows keep their names across studies, so
  `reports/cross_regime.py` lines them up; the figure names the method.

Each row pairs the method's full-data model (model `shard`, N = 1) with each reference on the same
test images, by the paired bootstrap over seeds and images (`reports/paired_bootstrap.py`). A
reference with one seed (the pixel one is deterministic) pairs with every seed of the method.
Holds: yes when every reference's interval lies above 0, no when any lies below, else undecided.
The test column is the tightest reference's (the lowest estimate); every reference's goes to
the note.
"""
from __future__ import annotations

import duckdb

from pipeline_src.reports import verdicts
from pipeline_src.reports.claim_rows import views
from pipeline_src.reports.claim_tests import column_text, interval
from pipeline_src.reports.paired_bootstrap import PairedGap, paired_bootstrap
from pipeline_src.reports.regimes import first

CLAIM = "Pretraining is worth it: {who} above every no-pretraining reference"
FC_ROW, BEST_ROW = CLAIM.format(who="FC"), CLAIM.format(who="the val-best fine-tuned method")
WHERE = "premise of all three papers (issue 42 §3)"
PAPER_FIGURE = "fine-tuned ImageNet backbones far above training from scratch"

# Per seed of method $t, its paired counts against reference $r at N = 1 on the test images both
# have; a reference with a single seed pairs with every seed of $t. A reference's rows may carry a
# variant (its own choice, e.g. pixel-logreg's C); the method's are the main DAG's (no variant).
REFERENCE_COUNTS_SQL = """
WITH t AS (SELECT seed, sample_id, correct FROM per_image_selected
           WHERE method = $t AND model = 'shard' AND shards = 1 AND split = 'test' AND variant IS NULL),
     r AS (SELECT seed, sample_id, correct FROM per_image_selected
           WHERE method = $r AND model = 'shard' AND shards = 1 AND split = 'test'
             AND (variant IS NULL OR kind = 'baseline')),
     one AS (SELECT count(DISTINCT seed) = 1 AS single, min(seed) AS seed0 FROM r)
SELECT t.seed, count(*) AS images, count(*) FILTER (WHERE t.correct AND NOT r.correct) AS t_only,
       count(*) FILTER (WHERE r.correct AND NOT t.correct) AS r_only
FROM t CROSS JOIN one
JOIN r ON r.sample_id = t.sample_id AND r.seed = CASE WHEN one.single THEN one.seed0 ELSE t.seed END
GROUP BY t.seed ORDER BY t.seed
"""

BASELINES_SQL = """
SELECT DISTINCT method FROM per_image_selected
WHERE kind = 'baseline' AND model = 'shard' AND shards = 1 AND split = 'test' ORDER BY method
"""

# The searched methods' selected points at N = 1 with their validation accuracy.
SELECTED_VAL_SQL = "SELECT method, val_accuracy FROM selection WHERE selected AND shards = 1"
# The search's grid points (`scratch_lr1e-3`): trained on train, scored on val, never a reference.
GRID_POINTS_SQL = "SELECT DISTINCT candidate FROM selection WHERE candidate NOT IN (SELECT method FROM selection)"


def references(con: duckdb.DuckDBPyConnection, methods: dict[str, dict]) -> list[str]:
    """The no-pretraining references with per-image test records: the baselines, then the
    methods with `init: random` (config order), less the search's grid points of them."""
    present = views(con)
    if "per_image_selected" not in present:
        return []
    grid = {r[0] for r in con.sql(GRID_POINTS_SQL).fetchall()} if "selection" in present else set()
    scratch = [m for m, cfg in methods.items() if cfg.get("init") == "random" and m not in grid]
    return [r[0] for r in con.sql(BASELINES_SQL).fetchall()] + scratch


def reference_gap(con: duckdb.DuckDBPyConnection, method: str, reference: str) -> PairedGap | None:
    """The paired gap `method` − `reference` of their full-data models; None without shared images."""
    rows = con.execute(REFERENCE_COUNTS_SQL, {"t": method, "r": reference}).fetchall()
    counts = [(int(n), int(a), int(b)) for _, n, a, b in rows]
    return paired_bootstrap(counts) if counts else None


def best_on_val(con: duckdb.DuckDBPyConnection, methods: dict[str, dict]) -> tuple[str, float] | None:
    """(the pretrained-init method whose selected N = 1 point has the best val accuracy, that
    accuracy); None without a search."""
    if "selection" not in views(con):
        return None
    rows = [(m, v) for m, v in con.sql(SELECTED_VAL_SQL).fetchall()
            if methods.get(m, {}).get("init") != "random" and v is not None]
    return max(rows, key=lambda mv: mv[1]) if rows else None


def _decide(gaps: dict[str, PairedGap]) -> str:
    decided = [verdicts.decide(g.low, g.high, 0.0) for g in gaps.values()]
    if "no" in decided:
        return "no"
    return "yes" if all(d == "yes" for d in decided) else verdicts.UNDECIDED


def premise_row(con: duckdb.DuckDBPyConnection, claim: str, method: str, refs: list[str], why: str) -> dict:
    """The fields of one premise row: `method` against each of `refs`.

    Args:
        con: a connection with the results views.
        claim: the row's name (`FC_ROW`, `BEST_ROW`).
        method: the fine-tuned method.
        refs: the references (`references`).
        why: how `method` was chosen, for the note.
    """
    head = {"claim": claim, "where": WHERE, "paper_figure": PAPER_FIGURE}
    gaps = {r: g for r in refs if (g := reference_gap(con, method, r)) is not None}
    lacking = [r for r in refs if r not in gaps]
    if not gaps:
        return head | {"study_figure": f"— no per-image test records shared by {method} (N = 1) and "
                       f"{', '.join(refs)}", "holds": "n/a"}
    tightest = min(gaps, key=lambda r: gaps[r].estimate)
    each = "; ".join(f"{r}: {interval(g)}" for r, g in gaps.items())
    note = (f"full-data models (model shard, N = 1); {method}: {why}; {method} − reference, paired per test "
            f"image: {each}" + (f"; no shared records with {', '.join(lacking)}" if lacking else ""))
    return head | {"study_figure": f"{method} − {tightest} (the closest reference) {interval(gaps[tightest])}",
                   "holds": _decide(gaps), "test": column_text(gaps[tightest], 0.0), "note": note}


def premise_rows(con: duckdb.DuckDBPyConnection, methods: dict[str, dict]) -> list[dict]:
    """The premise rows, FC's and the val-best fine-tuned method's; one n/a row when the study
    ran no reference.

    Args:
        con: a connection with the results views.
        methods: the config's methods in order (the first `fc` is FC; `init: random` marks a
            reference).
    """
    refs = references(con, methods)
    if not refs:
        return [{"claim": CLAIM.format(who="fine-tuned models"), "where": WHERE, "paper_figure": PAPER_FIGURE,
                 "holds": "n/a", "study_figure": "— the study ran no no-pretraining reference "
                 "(baselines.pixel_logreg, baselines.small_cnn, a method with init: random)"}]
    fc = first(methods, methods, "fc")
    rows = [premise_row(con, FC_ROW, fc, refs, "the first fc method, the backbone's features as they are")] if fc else []
    best = best_on_val(con, methods)
    if best is None:
        rows.append({"claim": BEST_ROW, "where": WHERE, "paper_figure": PAPER_FIGURE, "holds": "n/a",
                     "study_figure": "— no validation search at N = 1 (search.enabled): the best method "
                                     "would be chosen on test"})
    else:
        rows.append(premise_row(con, BEST_ROW, best[0], refs, f"the best selected point on validation at N = 1 "
                                f"({100 * best[1]:.1f} %)"))
    return rows
