"""Move the flat `pipeline_src/` and `tests/` into the layered layout (issue 13), and rewrite
every reference to a moved module: imports, dotted names (`python -m`, strings), file paths in
comments and docs, and the step names that `workflow/scripts/*.py` pass to `run_step`.

Idempotent, so it can be re-run on a merged tree:
- a module still (or again) at its old path is moved; one already moved is left alone;
- if both paths exist with the same bytes the old copy is deleted; with different bytes the
  script moves nothing for that pair, says CONFLICT and exits 2 (merge them by hand);
- references are rewritten in one pass per file, and no new name contains an old one, so a
  second run changes nothing.

Run from the repository root: `python tools/relayout.py` (`--dry-run` lists what it would do).
Entries whose old file does not exist (e.g. modules another branch adds) are skipped.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

# Old module → new module, below `pipeline_src.` (package layout: see README "Layout").
MODULES: dict[str, str] = {
    # plan/: parse time, imports no torch; the only package the rules import
    "config": "plan.config",
    "fusion_study": "plan.fusion",
    "privacy_config": "plan.privacy",
    "unlearning": "plan.forget",
    "datasets": "plan.samples",
    "sharding": "plan.sharding",
    # methods/: one registry of method kinds, their per-kind facts, shared training and evaluation
    "method_kinds": "methods.kinds",
    "methods": "methods.registry",
    "finetune": "methods.nonlinear",
    "training": "methods.training",
    "evaluation": "methods.evaluation",
    "composition": "methods.composition",
    "fusion_models": "methods.fusion_models",
    "dp.tuned": "methods.private",
    # data/: sample store, sharding, backbone
    "sample_store": "data.sample_store",
    "backbone": "data.backbone",
    "vit_parts": "vit.parts",
    # store/: what jobs write and what reads it back
    "atomic": "store.atomic",
    "model_io": "store.model_io",
    "provenance": "store.provenance",
    "metrics": "store.metrics",
    "results_db": "store.results_db",
    "query": "store.query",
    "audit": "store.audit",
    "benchmark_rows": "store.benchmark_rows",
    "export": "methods.export",
    # runner/: how a job starts
    "launch": "runner.launch",
    "forkserver": "runner.forkserver",
    "step_args": "runner.step_args",
    "gpu_slots": "runner.gpu_slots",
    "runtime": "runner.runtime",
    # reports/: one module per study
    "report": "reports.report",
    "report_files": "reports.files",
    "report_fusion": "reports.fusion",
    "report_privacy": "reports.privacy",
    "report_unlearning": "reports.unlearning",
    "report_last": "reports.last_grid",
    "report_benchmarks": "reports.benchmarks",
    # steps/: grouped like the rules
    "steps.fusion_train": "steps.fusion.train",
    "steps.fusion_match": "steps.fusion.match",
    "steps.fuse": "steps.fusion.fuse",
    "steps.train_private": "steps.privacy.train",
    "steps.compose_private": "steps.privacy.compose",
    "steps.evaluate_private": "steps.privacy.evaluate",
    "steps.forget_manifest": "steps.forget.manifest",
    "steps.unlearn_common": "steps.forget.common",
    "steps.unlearn_drop": "steps.forget.drop",
    "steps.unlearn_retrain": "steps.forget.retrain",
    "steps.unlearn_paragon": "steps.forget.paragon",
    # modules added on main beside the relayout
    "backbone_check": "plan.backbone_check",
    "environment": "plan.environment",
    "private_provenance": "store.private_provenance",
}

# Old test module → new one, below `tests.`: tests mirror pipeline_src/; real Snakemake runs in e2e/.
TESTS: dict[str, str] = {
    "test_config": "plan.test_config",
    "test_datasets": "plan.test_samples",
    "test_privacy_config": "plan.test_privacy",
    "test_unlearning": "plan.test_forget",
    "test_composition": "methods.test_composition",
    "test_finetune": "methods.test_nonlinear",
    "test_methods_last": "methods.test_side",
    "test_fusion_study": "methods.test_fusion_models",
    "test_backbone": "data.test_backbone",
    "test_sharding": "plan.test_sharding",
    "test_schema_versions": "store.test_schema_versions",
    "test_gpu_slots": "runner.test_gpu_slots",
    "test_report_benchmarks": "reports.test_benchmarks",
    "test_dp_book_keeping": "dp.test_book_keeping",
    "test_dp_budget": "dp.test_budget",
    "test_dp_last": "dp.test_last",
    "test_dp_norm_samplers": "dp.test_norm_samplers",
    "test_dp_reference": "dp.test_reference",
    "test_dp_taft": "dp.test_taft",
    "test_dp_training": "dp.test_training",
    "test_fusion_methods": "fusion.test_methods",
    "test_last_features": "last.test_features",
    "test_last_grid": "last.test_grid",
    "test_last_side_network": "last.test_side_network",
    "test_matching_lsa": "matching.test_lsa",
    "test_matching_scaling": "matching.test_scaling",
    "test_matching_sparse": "matching.test_sparse",
    "test_matching_timm": "matching.test_timm",
    "test_taft_compose": "taft.test_compose",
    "test_taft_layers": "taft.test_layers",
    "test_taft_model": "taft.test_model",
    "test_taft_opacus": "taft.test_opacus",
    "test_taft_train": "taft.test_train",
    "test_workflow_e2e": "e2e.test_workflow",
    "test_fusion_study_e2e": "e2e.test_fusion",
    "test_privacy_study": "e2e.test_privacy",
    "test_unlearning_e2e": "e2e.test_unlearning",
    "test_last_grid_study": "e2e.test_last_grid",
    "test_report_html": "e2e.test_report_html",
    "test_slurm": "e2e.test_slurm",
    # test files added on main beside the relayout
    "test_dp_release": "dp.test_release",
    "test_dp_layerscale_fast": "dp.test_layerscale_fast",
    "test_taft_backbones": "taft.test_backbones",
    "test_matching_norm_refusal": "matching.test_norm_refusal",
    "test_new_data_reruns": "e2e.test_new_data",
    "test_reliability_atomic": "store.test_atomic",
    "test_reliability_backbone": "plan.test_backbone_check",
    "test_reliability_datasets": "plan.test_samples_checks",
    "test_reliability_interrupt": "e2e.test_interrupt",
    "test_reliability_workflow": "e2e.test_reliability",
    "test_environment": "plan.test_environment",
    "test_environment_golden": "e2e.test_golden",
}

PACKAGE_DOCS = {
    "pipeline_src/plan": "Parse time, imports no torch: the validated config and each study's plan (what jobs exist).",
    "pipeline_src/methods": "Method kinds: per-kind facts (torch-free `kinds`), the registry, shared training and evaluation.",
    "pipeline_src/data": "Job-time data: the sample store, images, the backbone.",
    "pipeline_src/store": "What jobs write and what reads it back: atomic files, models, metrics, results db, audit.",
    "pipeline_src/runner": "How a Snakemake job runs a step: launch, fork server, step args, GPU slots, runtime.",
    "pipeline_src/reports": "Report tables and plots, one module per study.",
    "pipeline_src/steps/fusion": "Steps of the fusion study (workflow/rules/fusion.smk).",
    "pipeline_src/steps/privacy": "Steps of the privacy study (workflow/rules/privacy.smk).",
    "pipeline_src/steps/forget": "Steps of forgetting and the unlearning study (workflow/rules/forget.smk).",
}

SCOPE = ["pipeline_src", "workflow", "tests", "benchmarks", "tools", ".ci"]
SCOPE_FILES = ["Snakefile", "README.md", "Makefile", "pyproject.toml"]
SUFFIXES = {".py", ".smk", ".md", ".sh", ".yaml", ".yml", ".toml", ""}


def mod_path(dotted: str, root: str) -> Path:
    return Path(root, *dotted.split(".")).with_suffix(".py")


def all_moves() -> list[tuple[Path, Path]]:
    return ([(mod_path(o, "pipeline_src"), mod_path(n, "pipeline_src")) for o, n in MODULES.items()]
            + [(mod_path(o, "tests"), mod_path(n, "tests")) for o, n in TESTS.items()])


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True)


def tracked(path: Path) -> bool:
    return subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], capture_output=True).returncode == 0


def move(old: Path, new: Path, dry: bool) -> str | None:
    """Move one file; return a conflict message or None."""
    if not old.exists():
        return None
    if new.exists():
        if old.read_bytes() == new.read_bytes():
            print(f"rm   {old} (same as {new})")
            if not dry:
                git("rm", "-q", "-f", str(old)) if tracked(old) else old.unlink()
            return None
        return f"CONFLICT: {old} and {new} both exist and differ; merge them by hand, then delete {old}"
    print(f"mv   {old} -> {new}")
    if dry:
        return None
    new.parent.mkdir(parents=True, exist_ok=True)
    if tracked(old):
        git("mv", str(old), str(new))
    else:
        old.rename(new)
    deeper = len(new.parts) - len(old.parts)
    if deeper and new.suffix == ".py":  # keep paths computed from __file__ pointing at the same place
        text = new.read_text()
        fixed = text.replace("Path(__file__).resolve().parent.parent",
                             f"Path(__file__).resolve().parents[{1 + deeper}]")
        if fixed != text:
            new.write_text(fixed)
    return None


def ensure_packages(dry: bool) -> None:
    dirs = {n.parent for _, n in all_moves()}
    for d in sorted(dirs):
        for pkg in [d, *d.parents]:
            if str(pkg) in (".", "") or pkg.parts[0] not in ("pipeline_src", "tests"):
                continue
            init = pkg / "__init__.py"
            if pkg.is_dir() and not init.exists() and any(pkg.glob("*.py")):
                print(f"new  {init}")
                if not dry:
                    doc = PACKAGE_DOCS.get(str(pkg))
                    init.write_text(f'"""{doc}"""\n' if doc else "")
                    git("add", str(init))


def build_rewriter():
    """One regex pass per file: dotted module names, file paths, step names, `from pkg import mod`."""
    dotted = {f"pipeline_src.{o}": f"pipeline_src.{n}" for o, n in MODULES.items()}
    dotted.update({f"tests.{o}": f"tests.{n}" for o, n in TESTS.items()})
    paths = {str(o): str(n) for o, n in all_moves()}
    steps = {o[len("steps."):]: n[len("steps."):] for o, n in MODULES.items() if o.startswith("steps.")}
    # An old module that became a package (`methods` -> `methods/`): its new submodules are not attributes.
    leaves = {o: {n[len(o) + 1:].split(".")[0] for n in dotted.values() if n.startswith(o + ".")} for o in dotted}
    for o in dotted:  # and every module that exists in that package now
        pkg = Path(*o.split("."))
        if pkg.is_dir():
            leaves[o] |= {p.stem for p in pkg.iterdir() if p.suffix == ".py" or p.is_dir()}

    def alternation(keys):
        return "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))

    dotted_re = re.compile(rf"(?<![\w./])({alternation(dotted)})(?![\w])(\.\w+)?")
    path_re = re.compile(rf"(?<![\w./])({alternation(paths)})(?![\w])")
    step_re = re.compile(rf"""(run_step\(\s*["'])({alternation(steps)})(["'])""")
    from_re = re.compile(r"^(?P<indent>[ \t]*)from (?P<pkg>pipeline_src(?:\.\w+)*|tests) import (?P<names>[\w ,]+?)"
                         r"(?P<tail>[ \t]*(?:#.*)?)$", re.M)

    def sub_dotted(m: re.Match) -> str:
        if m[2] and m[2][1:] in leaves[m[1]]:
            return m[0]
        return dotted[m[1]] + (m[2] or "")

    for new in dotted.values():  # idempotency: no new name is rewritten again
        assert dotted_re.sub(sub_dotted, new) == new, new
    for new in paths.values():
        assert not path_re.search(new), new

    def split_from(m: re.Match) -> str:
        pkg, indent = m["pkg"], m["indent"]
        table = dotted
        keep, lines = [], []
        for part in m["names"].split(","):
            bits = part.split()
            if not bits:
                continue
            name, alias = bits[0], (bits[2] if len(bits) == 3 and bits[1] == "as" else bits[0])
            full = f"{pkg}.{name}"
            if full in table:
                parent, leaf = table[full].rsplit(".", 1)
                lines.append(f"{indent}from {parent} import {leaf}" + ("" if leaf == alias else f" as {alias}"))
            else:
                keep.append(part.strip())
        if not lines:
            return m[0]
        if keep:
            lines.insert(0, f"{indent}from {pkg} import {', '.join(keep)}")
        lines[-1] += m["tail"]
        return "\n".join(lines)

    def rewrite(text: str) -> str:
        text = from_re.sub(split_from, text)
        text = dotted_re.sub(sub_dotted, text)
        text = path_re.sub(lambda m: paths[m[1]], text)
        return step_re.sub(lambda m: m[1] + steps[m[2]] + m[3], text)

    return rewrite


def sort_imports(files: list[Path], dry: bool) -> None:
    """Re-sort the import blocks the rewrite changed (ruff's isort, configured in pyproject.toml)."""
    if not files or dry:
        return
    try:
        subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "I", "--fix", "--quiet", *map(str, files)],
                       check=False)
    except OSError:
        print("note: ruff not found; run `ruff check --select I --fix .` to sort the rewritten imports")


def files_in_scope() -> list[Path]:
    out = [Path(f) for f in SCOPE_FILES if Path(f).is_file()]
    for d in SCOPE:
        for p in Path(d).rglob("*") if Path(d).is_dir() else []:
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts and p.name not in ("relayout.py", "test_relayout.py"):
                out.append(p)
    return sorted(set(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = parser.parse_args(argv)
    if not Path("Snakefile").is_file() or not Path("pipeline_src").is_dir():
        parser.error("run from the repository root")
    conflicts = [c for old, new in all_moves() if (c := move(old, new, args.dry_run))]
    ensure_packages(args.dry_run)
    rewrite = build_rewriter()
    edited = []
    for f in files_in_scope():
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text)
        if new != text:
            print(f"edit {f}")
            edited.append(f)
            if not args.dry_run:
                f.write_text(new)
    sort_imports([f for f in edited if f.suffix == ".py"], args.dry_run)
    unmapped = sorted(p.name for p in Path("tests").glob("test_*.py"))
    if unmapped:
        print(f"note: test files with no entry in TESTS stay in tests/: {', '.join(unmapped)}")
    top = sorted(p.stem for p in Path("pipeline_src").glob("*.py") if p.stem != "__init__")
    if top:
        print(f"note: modules with no entry in MODULES stay in pipeline_src/: {', '.join(top)}")
    for c in conflicts:
        print(c, file=sys.stderr)
    return 2 if conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
