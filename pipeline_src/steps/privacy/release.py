"""release: the one folder of a DP study that may be handed out (`{R}/release/`).

    release/README.md            what this folder is, and what it leaves out on purpose
    release/privacy_report.{md,csv}  one row per DP model: Table 3's keys (protocol, method,
                                 regime, N, seed, model), target ε, ε spent, δ, σ, q, steps, C,
                                 accountant and its DP test accuracy
    release/backbone/            the public backbone, once
    release/models/<protocol>/<method>/<regime>/eps<e>/n<N>_s<seed>/<shard0|soup>/
                                 each DP model's export (`methods/export.py`: whitelisted record
                                 keys, member-id scan; its `backbone/` hard-links release/backbone)

Everything here is a function of the DP models (and public settings) only: no image counts, no
timings, no sample or shard sizes, nothing from non-DP training. The full report
(`results/report/`) is private workspace.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from pipeline_src.methods.export import copy_backbone, export_model
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.privacy.compose import composed_privacy
from pipeline_src.store.atomic import write_text

COLUMNS = ("protocol", "method", "regime", "N", "seed", "model", "target_epsilon", "epsilon_spent", "delta",
           "sigma", "q", "steps", "C", "accountant", "accuracy")
NOTICE = ("DP release: every file here is a function of the DP models and public settings only "
          "(no image counts, timings, sample or shard sizes, or non-DP results).")


def _model_of(metrics_path: Path) -> tuple[Path, list[Path]]:
    """A DP metrics file's model folder (under results/private) and the model files it evaluated."""
    parts = metrics_path.parts
    i = len(parts) - 1 - parts[::-1].index("metrics")
    base = Path(*parts[:i], *parts[i + 1:-1])  # results/metrics/private/... -> results/private/...
    name = metrics_path.stem
    if name == "ensemble":
        return base, sorted(base.glob("shard*.safetensors"))
    return base, [base / f"{name}.safetensors"]


def report_row(metrics_path: Path) -> dict:
    """One release row: the model's DP parameters from its record(s), its accuracy from its metrics."""
    base, models = _model_of(metrics_path)
    records = [json.loads(p.with_suffix(".json").read_text()) for p in models]
    if not records:
        raise FileNotFoundError(f"release: no DP model under {base} for {metrics_path}")
    privacy = records[0]["privacy"] if len(records) == 1 else composed_privacy(records)
    one = privacy.get("components", [privacy])[0]  # shards share σ, q, steps and C
    table = pq.read_table(metrics_path, columns=["metric", "value"]).to_pylist()
    accuracy = [r["value"] for r in table if r["metric"] == "accuracy"]
    if len(accuracy) != 1:
        raise ValueError(f"release: {metrics_path} has {len(accuracy)} accuracy rows, expected 1")
    first = records[0]
    protocol, run = base.parts[-5], base.parts[-1]
    return {"protocol": protocol, "method": first["method"], "regime": first["regime"], "N": first["shards"],
            "seed": int(run.rsplit("_s", 1)[1]), "model": metrics_path.stem, "target_epsilon": privacy["epsilon"],
            "epsilon_spent": privacy["epsilon_spent"], "delta": privacy["delta"], "sigma": one["sigma"],
            "q": one["sample_rate"], "steps": one["steps_taken"], "C": one["max_grad_norm"],
            "accountant": privacy["accountant"], "accuracy": accuracy[0]}


def _link_backbone(export: Path, shared: Path) -> None:
    """Replace an export's backbone copy by hard links to the release's one (one copy on disk)."""
    for f in (export / "backbone").iterdir():
        f.unlink()
        try:
            os.link(shared / f.name, f)
        except OSError:  # another file system: a copy
            shutil.copyfile(shared / f.name, f)


def _markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |"
    lines = [f"<!-- {NOTICE} -->", "# DP models of this study (TAFT Table 3 rows)", "", head,
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS)
                     + " |")
    return "\n".join(lines) + "\n"


def build_release(metrics: list[str], backbone_dir: Path, out: Path) -> list[dict]:
    """Write the release folder `out` (replaced whole) from the DP models' metrics files.

    Args:
        metrics: every DP metrics file of the study (`plan.privacy.private_evaluation_targets`).
        backbone_dir: the backbone folder (`results/pretrain`).
        out: the release folder.
    Returns:
        The report rows.
    """
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    copy_backbone(backbone_dir, staging / "backbone", dp_study=True)
    rows = []
    for path in sorted(Path(p) for p in metrics):
        row = report_row(path)
        base, models = _model_of(path)
        if path.stem != "ensemble":  # an ensemble is its shards, exported on their own
            dest = staging / "models" / Path(*base.parts[-5:]) / path.stem
            dest.parent.mkdir(parents=True, exist_ok=True)
            export_model(models[0], dest, backbone_dir)
            _link_backbone(dest, staging / "backbone")
        rows.append(row)
    rows.sort(key=lambda r: (r["protocol"], r["method"], r["regime"], r["N"], r["target_epsilon"], r["seed"], r["model"]))
    rows = [{c: r[c] for c in COLUMNS} for r in rows]
    csv = [",".join(COLUMNS)] + [",".join(repr(r[c]) if isinstance(r[c], float) else str(r[c]) for c in COLUMNS)
                                 for r in rows]
    write_text("\n".join(csv) + "\n", staging / "privacy_report.csv")
    write_text(_markdown(rows), staging / "privacy_report.md")
    write_text(f"# DP release\n\n{NOTICE}\n\nLoad a model with `pipeline_src.methods.export.load_exported("
               "'models/<protocol>/<method>/<regime>/eps<e>/n<N>_s<seed>/<shard0|soup>')`. The study's full report "
               "(results/report/) is private workspace: it counts images, times jobs and holds non-DP results.\n",
               staging / "README.md")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return rows


def main(args: StepArgs) -> None:
    out = Path(args.output.release)
    rows = build_release(list(args.input.metrics), Path(args.input.backbone).parent, out)
    print(f"release: {len(rows)} DP models -> {out}")
