"""The claims table: each published claim the pipeline tests, beside this study's figure.

`claims.{md,csv}`: one row per claim (and per shard count N, ε, fusion setting ... where the
claim is made at several), with the paper, its table or figure, the paper's figure (a relation
in words where the paper gives no single number; the figures are those of issue 23), this
study's figure, and whether the claim holds: `yes`, `no`, `undecided`, or `n/a` when the study did
not run the jobs it needs (this study's cell then says which). The `note` column (a list under the
Markdown table) names the rows compared.

Every comparative row whose models wrote per-image records (`store/per_image.py`) is decided by
a paired bootstrap over seeds and test images (`reports/claim_tests.py`): its `test` column gives
the estimate, the 95 % interval and the threshold, and `holds` is yes / no when the interval lies
above / below the threshold, undecided when it holds it. Without such records the point gap
(mean over seeds) says yes / no under the rules below, and the verdict is `no paired test`.

Which rows each claim compares (accuracies: metric `accuracy` on the test split, averaged over
seeds; pts: percentage points; rows from `reports/claim_rows.py`):

- **The TAFT pair.** T: the first method in config order of kind taft with k = 1 that has the
  claim's rows; F: the first nlft method with k = 1 that has them (T's non-linear counterpart,
  as `methods.kinds.nonlinear_counterpart` defines it). Without a config (`methods=None`) the
  methods are the trained records' (`models` view), in name order. Rows per method follow the
  same order.
- **TAFT-1 within 1 pt of NLFT-1** (TAFT Table 1): the full-data models (model `shard`, N = 1,
  no variant) of T and F. Holds when T ≥ F − 1 pt (a T above F holds too).
- **TAFT composition ≥ non-linear soup** (TAFT Table 2): one row per N > 1 with soups: T's soup
  (its Δw sum) against F's soup at that N. Holds when T ≥ F.
- **TAFT subtract ≥ SISA drop** (TAFT Figure 1): one row per N of the unlearning study: T's
  `subtract` rows against F's `sisa-drop` rows for the same removed shards (r ≥ 1; r = 0 removes
  nothing), each averaged over requests per r; the figure is the mean over r. Tested: the mean
  over r of the paired gap (each r's own interval in the note) ≥ 0. Point rule: T ≥ F at every r.
- **DP TAFT ≥ DP NLFT at each ε** (TAFT Table 3): one row per protocol and ε of the privacy
  study: T's and F's DP models at N = 1 (model `dp-shard`) in each regime both have. Tested: the
  mean over those regimes of the paired gap (each regime's interval in the note) ≥ 0. Point rule:
  T ≥ F in every such regime.
- **Matching raises the soup** (rotation paper, Table 2): one row per fusion method, N and
  init: the fusion study's soup (`fusion-soup`) after the paper's matching (`rotation-scaling`,
  else `rotation`) against the soup without matching (`none`), paired per seed and image. Holds
  when strictly above (the interval's low end above 0).
- **LAST ≥ FC at ≤ 25 % of full fine-tuning's memory** (LAST paper): the first last, fc and full
  methods (config order) with full-data models: LAST's accuracy against FC's, and the training
  memory of LAST's N = 1 training job against full's: `train_mem_mb` of the train records, tensors
  counted as Table 7 counts them (`job/training_memory.py`), or, for records without it,
  `peak_mem_mb` (CUDA max allocated on a GPU, the process's max RSS on the CPU); same device
  required. Holds when both hold.
- **Retrain-shard ≈ N× cheaper than the paragon** (SISA; TAFT Figure 3): one row per method and
  N of the unlearning study: the `unlearn_time_s` of `retrain-shard` over the requests that
  touched exactly one shard, against the same-method `paragon`'s (retraining on everything
  minus the same request; the unlearning report's `speedup_vs_paragon`). Holds when the
  speed-up is ≥ N / 2 (`bench_unlearning`'s goal: fixed costs per job do not shrink with the
  shard). n/a when every request touched several shards.
- **Pretraining is worth it** (the table's first rows: the papers' premise, issue 42 §3): FC, and the fine-tuned method
  best on validation, each against every no-pretraining reference (`reports/testbed_claims.py`).
  Holds when every paired interval lies above 0.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import duckdb
import pandas as pd

from pipeline_src.reports import claim_pairs, claim_rows, testbed_claims, verdicts
from pipeline_src.reports.claim_tests import EPS, PairedCounts, point_holds, tested_cases, tested_gap
from pipeline_src.reports.claim_tests import pts as _pts
from pipeline_src.reports.regimes import first, measured_regime, paper_holds, paper_rows
from pipeline_src.store.atomic import write_text

TAFT = "TAFT: Liu, Soatto et al., ICLR 2024"
ROTATION = "Rotation symmetry: Zhang et al., ICML 2025"
LAST = "LAST: Tang et al., 2024"
SISA = "SISA: Bourtoule et al., 2021; TAFT"
PAPERS = {  # the full references, listed under the Markdown table
    TAFT: "Tangent Transformers for Composition, Privacy and Removal",
    ROTATION: "Beyond the Permutation Symmetry of Transformers: The Role of Rotation for Model Fusion",
    LAST: "Low-Rank Attention Side-Tuning for Parameter-Efficient Fine-Tuning",
    "SISA: Bourtoule et al., 2021": "Machine Unlearning (IEEE S&P 2021)",
}
PREMISE = "TAFT, LAST, rotation symmetry"
PAPER_SHARDS = (10, 25, 50)  # the N of TAFT Table 2
WITHIN_PTS = 1.0  # Table 1: TAFT-1 within this many points of NLFT-1
LAST_MEMORY = 0.25  # LAST: at most this fraction of full fine-tuning's memory

COLUMNS = {"claim": "claim", "paper": "paper", "where": "paper table/figure", "paper_figure": "paper's figure",
           "paper_regime": "paper made it for", "paper_rows": "paper's rows at this distance",
           "study_figure": "this study's figure", "test": "paired test: estimate [95 % interval]",
           "holds": "holds", "verdict": "verdict vs the paper's row", "note": "note"}
# Per-image pairs of the study claims (`claim_pairs`): (T, F, N) for unlearning, (T, F, protocol,
# ε) for DP, (method, N, init, matching) for fusion -> seed, case, sample_id, d rows
PairsOf = Callable[..., pd.DataFrame]


@dataclass
class Claim:
    """One row of the claims table."""

    claim: str
    paper: str
    where: str
    paper_figure: str
    study_figure: str
    holds: str  # yes | no | undecided | n/a
    note: str = ""
    paper_regime: str = ""  # the regime the paper made the claim for (`reports/regimes.py`)
    paper_rows: str = ""  # the paper's rows at this study's measured distance
    test: str = ""  # the paired test's estimate, interval and name; empty where none ran
    verdict: str = ""  # `reports/verdicts.py`: agrees | disagrees | undecided | by construction | ...


def missing(claim: str, paper: str, where: str, paper_figure: str, why: str, note: str = "") -> Claim:
    """A claim the study cannot test: `why` names the jobs it did not run."""
    return Claim(claim, paper, where, paper_figure, f"— {why}", "n/a", note)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _pair(methods: dict[str, dict], available) -> tuple[str | None, str | None]:
    """(T, F): the first taft method with k = 1 and the first nlft method with k = 1 in `available`."""
    return first(methods, available, "taft", 1), first(methods, available, "nlft", 1)


def _pair_missing(t: str | None, f: str | None, rows: str) -> str:
    return " and ".join(f"no {kind} method with k = 1 has {rows}" for kind, m in (("taft", t), ("nlft", f)) if m is None)


def table1_claim(acc: pd.DataFrame, methods: dict[str, dict], paired: PairedCounts | None = None) -> list[Claim]:
    """TAFT-1 within 1 pt of NLFT-1 (full-data models); `paired`: per-image counts for the test."""
    head = ("TAFT-1 within 1 pt of NLFT-1", TAFT, "Table 1", "TAFT-1 about 1 pt below NLFT-1")
    full = acc[(acc.model == "shard") & (acc.shards == 1)] if len(acc) else acc
    t, f = _pair(methods, full.method if len(full) else [])
    if t is None or f is None:
        return [missing(*head, _pair_missing(t, f, "a full-data (N = 1) model"))]
    a, b = (full[full.method == m].accuracy.iloc[0] for m in (t, f))
    holds, test = tested_gap(paired, t, f, "shard", 1, a - b, -WITHIN_PTS / 100)
    return [Claim(*head, f"{t} {_pct(a)}, {f} {_pct(b)} ({_pts(a - b)})", holds,
                  f"full-data models (model shard, N = 1) of {t} and {f}; holds when {t} ≥ {f} − {WITHIN_PTS:g} pt; "
                  "undecided when the paired test's 95 % interval holds that threshold", test=test)]


def composition_claims(acc: pd.DataFrame, methods: dict[str, dict], paired: PairedCounts | None = None) -> list[Claim]:
    """TAFT's Δw sum ≥ the non-linear soup, one row per N > 1; `paired`: per-image counts for the test."""
    paper_text = "+9 to +13.5 pts over the non-linear soup at N = 10–50"
    soups = acc[acc.model == "soup"] if len(acc) else acc
    t, f = _pair(methods, soups.method if len(soups) else [])
    claim = "TAFT composition (Δw sum) ≥ non-linear soup"
    if t is None or f is None:
        return [missing(claim, TAFT, "Table 2", paper_text, _pair_missing(t, f, "soups (N > 1)"))]
    out = []
    for n in sorted(set(soups[soups.method.isin([t, f])].shards)):
        head = (f"{claim}, N = {n}", TAFT, "Table 2",
                paper_text if n in PAPER_SHARDS else f"not reported at N = {n} ({paper_text})")
        at = soups[soups.shards == n].set_index("method").accuracy
        if t not in at or f not in at:
            out.append(missing(*head, f"no soup of {t if t not in at else f} at N = {n}"))
            continue
        holds, test = tested_gap(paired, t, f, "soup", int(n), at[t] - at[f], 0.0)
        out.append(Claim(*head, f"{t} Δw sum {_pct(at[t])}, {f} soup {_pct(at[f])} ({_pts(at[t] - at[f])})", holds,
                         f"model soup, N = {n}, of {t} (its Δw sum) and {f}", test=test))
    return out


def _with_test(holds: str, note: str, tested: tuple[str, str, str] | None) -> tuple[str, str, str]:
    """(holds, note, test) of a row: the paired test's where it ran (its per-case intervals
    added to the note), else the point rule's `holds` and no test."""
    if tested is None:
        return holds, note, ""
    decided, test, each = tested
    return decided, note + (f"; {each}" if each else ""), test


def subtract_claims(drop: pd.DataFrame, methods: dict[str, dict], pairs: PairsOf | None = None) -> list[Claim]:
    """TAFT subtract ≥ SISA drop, one row per N of the unlearning study; `pairs`: its per-image
    pairs (`claim_pairs.drop_pairs`) for the paired test on the mean over r."""
    claim, paper_text = "TAFT subtract ≥ SISA drop", "about +11 pts over SISA drop"
    subtract = drop[drop.model == "subtract"] if len(drop) else drop
    sisa = drop[drop.model == "sisa-drop"] if len(drop) else drop
    t = first(methods, subtract.method if len(subtract) else [], "taft", 1)
    f = first(methods, sisa.method if len(sisa) else [], "nlft", 1)
    if t is None or f is None:
        why = _pair_missing(t, f, "unlearning-study rows (forget.study: subtract / sisa-drop)")
        return [missing(claim, TAFT, "Figure 1", paper_text, why)]
    out = []
    for n in sorted(set(subtract[subtract.method == t].shards) | set(sisa[sisa.method == f].shards)):
        head = (f"{claim}, N = {n}", TAFT, "Figure 1", paper_text)
        a = subtract[(subtract.method == t) & (subtract.shards == n)].groupby("removed").accuracy.mean()
        b = sisa[(sisa.method == f) & (sisa.shards == n)].groupby("removed").accuracy.mean()
        both = sorted(set(a.index) & set(b.index))
        if not both:
            out.append(missing(*head, f"no removed-shard count r with both {t} subtract and {f} SISA drop at N = {n}"))
            continue
        diff = a[both] - b[both]
        per_r = "; ".join(f"r = {r}: {_pct(a[r])} vs {_pct(b[r])}" for r in both)
        failing = [r for r in both if diff[r] < -EPS]
        note = (f"N = {n}, removed shards r (mean over requests): {per_r}"
                + (f"; below at r = {', '.join(map(str, failing))}" if failing else ""))
        tested = tested_cases(pairs(t, f, int(n)), 0.0, "r") if pairs is not None else None
        holds, note, test = _with_test(_yes(not failing), note, tested)
        out.append(Claim(*head, f"{t} subtract {_pct(a[both].mean())}, {f} SISA drop {_pct(b[both].mean())} "
                         f"({_pts(diff.mean())}, mean over r = {', '.join(map(str, both))})", holds, note, test=test))
    return out


def dp_claims(dp: pd.DataFrame, methods: dict[str, dict], pairs: PairsOf | None = None) -> list[Claim]:
    """DP TAFT ≥ DP NLFT, one row per protocol and ε; `pairs`: the DP models' per-image pairs
    (`claim_pairs.dp_pairs`) for the paired test on the mean over regimes."""
    claim, paper_text = "DP TAFT ≥ DP NLFT", "TAFT above NLFT at each ε"
    t, f = _pair(methods, dp.method if len(dp) else [])
    if t is None and f is None:
        return [missing(claim, TAFT, "Table 3", paper_text, "the privacy study ran no taft or nlft method with k = 1 "
                        "(privacy.enabled, privacy.methods)")]
    out = []
    for (protocol, eps), g in sorted(dp[dp.method.isin([t, f])].groupby(["protocol", "epsilon"]),
                                     key=lambda kv: (kv[0][0] != "ours", kv[0])):
        head = (f"{claim}, ε = {eps:g} ({protocol} protocol)", TAFT, "Table 3", paper_text)
        acc = g.pivot_table(index="regime", columns="method", values="accuracy")
        lacking = [m or f"no {kind} method with k = 1" for kind, m in (("taft", t), ("nlft", f)) if m not in acc]
        if lacking:
            out.append(missing(*head, f"{' and '.join(lacking)}: no DP model under the {protocol} protocol "
                               f"at ε = {eps:g}"))
            continue
        acc = acc.dropna(subset=[t, f])
        if acc.empty:
            out.append(missing(*head, f"{t} and {f} share no regime at ε = {eps:g}"))
            continue
        cells = [f"{r}: {_pct(x[t])} vs {_pct(x[f])} ({_pts(x[t] - x[f])})" for r, x in acc.iterrows()]
        failing = [r for r, x in acc.iterrows() if x[t] < x[f] - EPS]
        note = (f"DP models (dp-shard, N = 1) of {t} and {f}, protocol {protocol}, ε = {eps:g}, regimes "
                f"{', '.join(acc.index)}" + (f"; below in {', '.join(failing)}" if failing else ""))
        tested = tested_cases(pairs(t, f, protocol, float(eps)), 0.0, "regime") if pairs is not None else None
        holds, note, test = _with_test(_yes(not failing), note, tested)
        out.append(Claim(*head, f"{t} vs {f}: " + "; ".join(cells), holds, note, test=test))
    return out


def _in_order(methods: dict[str, dict], names) -> list[str]:
    """`names` in config order, then any the config does not list, by name."""
    names = set(names)
    return [m for m in methods if m in names] + sorted(names - set(methods))


def fusion_claims(fusion: pd.DataFrame, methods: dict[str, dict], pairs: PairsOf | None = None) -> list[Claim]:
    """Matching before merging raises the soup, one row per fusion method, N and init; `pairs`:
    the soups' per-image pairs (`claim_pairs.fusion_pairs`) for the paired test."""
    claim, paper_text = "Matching before merging raises the soup's accuracy", "matched soup above the unmatched soup"
    if fusion.empty:
        return [missing(claim, ROTATION, "Table 2", paper_text, "the fusion study did not run (fusion.enabled)")]
    out = []
    rank = {m: i for i, m in enumerate(_in_order(methods, fusion.method))}
    groups = sorted(fusion.groupby(["method", "shards", "init"]), key=lambda kv: (rank[kv[0][0]], *kv[0][1:]))
    for (method, n, init), g in groups:
        acc = g.set_index("matching").accuracy
        head = (f"{claim}: {method}, N = {n}, {init}", ROTATION, "Table 2", paper_text)
        matched = next((m for m in ("rotation-scaling", "rotation") if m in acc), None)
        if matched is None or "none" not in acc:
            out.append(missing(*head, "no soup " + ("without matching" if matched else "after rotation matching")
                               + " (fusion.matching)"))
            continue
        tested = tested_cases(pairs(method, int(n), init, matched), 0.0, "") if pairs is not None else None
        holds, _, test = _with_test(point_holds(acc[matched] - acc["none"], 0.0, strict=True), "", tested)
        out.append(Claim(*head, f"{matched} {_pct(acc[matched])}, none {_pct(acc['none'])} "
                         f"({_pts(acc[matched] - acc['none'])})", holds,
                         f"fusion-soup of {method}, N = {n}, init {init}: matching {matched} vs none, over "
                         f"{g.seeds.max()} seed{'s' if g.seeds.max() > 1 else ''}", test=test))
    return out


def last_claim(acc: pd.DataFrame, memory: pd.DataFrame, methods: dict[str, dict]) -> list[Claim]:
    """LAST ≥ FC in accuracy at ≤ 25 % of full fine-tuning's training memory."""
    head = ("LAST ≥ FC at ≤ 25 % of full fine-tuning's memory", LAST, "Table 7 (memory), accuracy tables",
            "accuracy ≥ FC (linear probing) with ≤ 25 % of full fine-tuning's training memory")
    full_data = acc[(acc.model == "shard") & (acc.shards == 1)] if len(acc) else acc
    names = list(full_data.method) if len(full_data) else []
    last, fc, full = (first(methods, names, kind) for kind in ("last", "fc", "full"))
    if last is None or fc is None:
        kinds = " and ".join(k for k, m in (("last", last), ("fc", fc)) if m is None)
        return [missing(*head, f"no {kinds} method with a full-data (N = 1) model")]
    a = full_data.set_index("method").accuracy
    accuracy = f"{last} {_pct(a[last])}, {fc} {_pct(a[fc])} ({_pts(a[last] - a[fc])})"
    if full is None:
        return [missing(*head, f"no full method trained at N = 1; accuracy: {accuracy}")]
    mem = memory.set_index("method") if len(memory) else pd.DataFrame(columns=["peak_mem_mb", "device"])
    if last not in mem.index or full not in mem.index:
        lacking = ", ".join(m for m in (last, full) if m not in mem.index)
        return [missing(*head, f"no peak_mem_mb in the N = 1 train records of {lacking} (trained before it was "
                        f"recorded); accuracy: {accuracy}")]
    if mem.device[last] != mem.device[full] or "," in mem.device[last]:
        return [missing(*head, f"memory measured on different devices ({mem.device[last]}; {mem.device[full]}); "
                        f"accuracy: {accuracy}")]
    counted = "train_mem_mb" in mem and mem.train_mem_mb[[last, full]].notna().all()
    if counted:  # tensors, as Table 7 counts them: the process's own baseline left out
        used, what = mem.train_mem_mb, "weights + gradients + AdamW state + one batch's saved activations"
    else:
        used = mem.peak_mem_mb
        what = "CUDA max allocated" if mem.device[last].startswith("cuda") else "process peak RSS"
    ratio, digits = used[last] / used[full], 1 if counted else 0
    return [Claim(*head, f"{accuracy}; memory {used[last]:.{digits}f} MB = {100 * ratio:.0f} % of {full}'s "
                  f"{used[full]:.{digits}f} MB", _yes(a[last] >= a[fc] - EPS and ratio <= LAST_MEMORY),
                  f"full-data models of {last}, {fc}; peak memory of the N = 1 training jobs of {last} and {full} "
                  f"({what}, {mem.device[last]})")]


def unlearning_cost_claims(retrain: pd.DataFrame, methods: dict[str, dict]) -> list[Claim]:
    """Retrain-shard about N× cheaper than the same-method paragon, one row per method and N."""
    claim, paper_text = "Unlearning cost: retrain-shard ≈ N× cheaper than the paragon", "≈ N× (one of N shards retrains)"
    where = "TAFT Figure 1c / Figure 3"
    shard = retrain[retrain.model == "retrain-shard"] if len(retrain) else retrain
    if shard.empty:
        return [missing(claim, SISA, where, paper_text, "the unlearning study did not run (forget.study)")]
    paragon = retrain[retrain.model == "paragon"]
    out = []
    for method in _in_order(methods, shard.method):
        for n in sorted(set(shard[shard.method == method].shards)):
            head = (f"{claim}: {method}, N = {n}", SISA, where, paper_text)
            rows = shard[(shard.method == method) & (shard.shards == n)]
            one = rows[rows.affected_shards == 1]
            if one.empty:
                out.append(missing(*head, f"no request touched a single shard (fewest: "
                                   f"{rows.affected_shards.min():.0f} of {n}; add 0, single-sample requests, to "
                                   "forget.study.forget_fractions)"))
                continue
            keys = ["seed", "fraction", "request"]
            par = paragon[paragon.method == method].merge(one[keys], on=keys)
            if par.empty:
                out.append(missing(*head, f"no paragon of {method} for the single-shard requests"))
                continue
            speedup = par.unlearn_time_s.mean() / one.unlearn_time_s.mean()
            out.append(Claim(*head, f"{speedup:.1f}× ({one.unlearn_time_s.mean():.2f} s vs paragon "
                             f"{par.unlearn_time_s.mean():.2f} s)", _yes(speedup >= n / 2),
                             f"unlearn_time_s of {method} retrain-shard over {len(one)} request(s) touching one "
                             f"shard, and of its paragon for the same requests; holds when ≥ N / 2 = {n / 2:g}×"))
    return out


def by_construction(key: str, claim: Claim) -> bool:
    """Rows that hold whatever the models learn: the retrain-cost ratios (one of N shards
    retrains, so the ratio is about N up to fixed costs), and matching soups at the shared init
    with one seed (the shard models start from one point, so matching has next to nothing to
    align and one seed gives no spread)."""
    if key == "cost":
        return claim.holds != "n/a"
    return key == "fusion" and claim.claim.endswith(", shared") and claim.holds != "n/a" and claim.note.endswith(" 1 seed")


def row_verdict(key: str, claim: Claim, paper: bool | None) -> str:
    """The row's verdict (`reports/verdicts.py`): against the paper's row at the study's distance
    where a paired test decided it; `no paired test` where none ran."""
    if claim.holds == "n/a":
        return verdicts.NA
    if key == "testbed":
        return verdicts.PREMISE
    if by_construction(key, claim):
        return verdicts.BY_CONSTRUCTION
    if not claim.test:
        return verdicts.NOT_TESTED
    return verdicts.verdict(claim.holds, paper)


def study_claims(con: duckdb.DuckDBPyConnection, methods: dict[str, dict] | None = None) -> list[Claim]:
    """Every claim, in the table's order.

    Args:
        con: a connection with the results views (`store.results_db.connect`).
        methods: the config's `methods:` (its order picks "the first" method of a kind); None:
            the trained records' methods in name order.
    """
    methods = methods if methods is not None else claim_rows.recorded_methods(con)
    acc = claim_rows.accuracy_rows(con)
    regime = measured_regime(acc, methods)

    def paired(t: str, f: str, model: str, n: int) -> list[tuple[int, int, int]]:
        return claim_rows.paired_counts(con, t, f, model, n)

    keyed = [("testbed", [Claim(paper=PREMISE, **row) for row in testbed_claims.premise_rows(con, methods)]),
             ("table1", table1_claim(acc, methods, paired)), ("table2", composition_claims(acc, methods, paired)),
             ("figure1", subtract_claims(claim_rows.drop_rows(con), methods,
                                         lambda *key: claim_pairs.drop_pairs(con, *key))),
             ("table3", dp_claims(claim_rows.privacy_rows(con), methods, lambda *key: claim_pairs.dp_pairs(con, *key))),
             ("fusion", fusion_claims(claim_rows.fusion_rows(con), methods,
                                      lambda *key: claim_pairs.fusion_pairs(con, *key))),
             ("last", last_claim(acc, claim_rows.memory_rows(con), methods)),
             ("cost", unlearning_cost_claims(claim_rows.retrain_rows(con), methods))]
    chosen = claim_rows.selected_points(con)
    out = []
    for key, claims in keyed:
        made_for, rows = paper_rows(key, regime)
        for c in claims:
            n = int(m.group(1)) if (m := re.search(r"N = (\d+)", c.claim)) else 1
            picks = [f"{name} at N = {n}: {p}" for (name, at), p in chosen.items()
                     if at == n and key in ("table1", "table2") and re.search(rf"\b{re.escape(name)}\b", c.study_figure)]
            note = c.note + ("; selected on validation: " + "; ".join(picks) if picks else "")
            out.append(replace(c, paper_regime=made_for, paper_rows=rows, note=note,
                               verdict=row_verdict(key, c, paper_holds(key, regime))))
    return out


def study_settings(config: dict) -> str:
    """One line of the study's settings that the claims depend on (dataset, backbone, training)."""
    ds, bb, tr = config.get("dataset", {}), config.get("backbone", {}), config.get("train", {})
    parts = [f"experiment `{config.get('experiment')}`"]
    parts.append("dataset " + ", ".join(f"{k} {ds[k]}" for k in ("source", "path", "img_size", "limit_per_class",
                                                                 "source_classes") if ds.get(k) is not None))
    test_limit = ds.get("test_limit_per_class", "same")  # `same`: as limit_per_class, left out of the settings
    if test_limit != "same":
        parts[-1] += f", test_limit_per_class {'null (every test image)' if test_limit is None else test_limit}"
    arch = bb.get("arch") or {}
    parts.append("backbone " + ", ".join([str(bb.get("source"))] + [f"{k} {bb[k]}" for k in ("timm_name", "checkpoint")
                                                                    if bb.get(k)]
                                         + [f"{k} {v}" for k, v in arch.items() if v is not None]))
    parts.append("training " + ", ".join(f"{k} {tr[k]}" for k in ("epochs", "batch_size", "lr") if k in tr))
    parts += [f"shards {config.get('shards')}", f"seeds {config.get('seeds')}", f"device {config.get('device', 'auto')}"]
    return "; ".join(parts)


def claims_report(con: duckdb.DuckDBPyConnection, out_dir: Path, config: dict | None = None) -> list[Path]:
    """Write `claims.md` (table, then each row's note) and `claims.csv` (with the notes).

    Args:
        con: a connection with the results views.
        out_dir: the report folder.
        config: the study's config (its methods' order, and a settings line in the Markdown);
            None: methods from the trained records, no settings line.
    """
    claims = study_claims(con, config["methods"] if config else None)
    df = pd.DataFrame([asdict(c) for c in claims], columns=list(COLUMNS)).rename(columns=COLUMNS)
    md, csv = out_dir / "claims.md", out_dir / "claims.csv"
    counts, told = df.holds.value_counts(), df[COLUMNS["verdict"]].value_counts()
    text = ["# Claims: the papers' figures beside this study's", ""]
    if config:
        text += [f"Study: {study_settings(config)}.", ""]
    methods = config["methods"] if config else claim_rows.recorded_methods(con)
    text += [f"Regime (measured distance, `reports/regimes.py`): {measured_regime(claim_rows.accuracy_rows(con), methods).label()}.", ""]
    text += ["Verdicts against the paper's rows at this distance (paired tests only; rows true by construction "
             "left out): " + ", ".join(f"{v} {told.get(v, 0)}" for v in verdicts.TALLIED)
             + f". Not in the tally: testbed premise {told.get(verdicts.PREMISE, 0)}, by construction "
             f"{told.get(verdicts.BY_CONSTRUCTION, 0)}, no paired test "
             f"{told.get(verdicts.NOT_TESTED, 0)}, n/a {told.get(verdicts.NA, 0)}.", "",
             f"Holds: yes {counts.get('yes', 0)}, no {counts.get('no', 0)}, undecided {counts.get('undecided', 0)}, "
             f"n/a {counts.get('n/a', 0)} (n/a: the study did not run the jobs the claim needs). Accuracies on the "
             "test split, mean over seeds; where the study searched, of the point selected on validation "
             "(`search_selection`). A paired test (bootstrap over seeds and test images, "
             "`reports/paired_bootstrap.py`) decides `holds` where per-image records exist: yes / no when its 95 % "
             "interval lies above / below the claim's threshold, undecided when it holds it. pts: percentage points. "
             "Selection rules: `pipeline_src/reports/claims.py`.", "",
             df.drop(columns="note").to_markdown(index=False), "", "## Rows compared", ""]
    text += [f"- {c.claim}: {c.note}." for c in claims if c.note]
    text += ["", "## Papers", ""] + [f"- {short}: {title}" for short, title in PAPERS.items()]
    write_text("\n".join(text) + "\n", md)
    write_text(df.to_csv(index=False), csv)
    return [md, csv]


REPORTS: dict = {"claims": claims_report}
