"""Every rule of the workflow runs its step through `launch.run_job`, and its step module exists."""
from __future__ import annotations

import importlib
import re

from pipeline_src.plan.per_image_files import PER_IMAGE_STEPS, per_image_files
from pipeline_src.steps import step_of_rule
from tests.conftest import REPO

RUN_JOB = "run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)"


def rules_with_runs() -> dict[str, str]:
    """Rule name -> the body of its `run:` block, read from workflow/rules/*.smk (a rule's block up to the next rule)."""
    out = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for block in re.split(r"\n(?=\s*rule\b)", text):
            m = re.match(r"\s*rule\s*(\w*):", block)
            run = re.search(r"\brun:\s*\n\s*(.+)", block)
            if not m or not run:
                continue
            name = m[1] or "train_vectorized_m_n4_s0"  # rules named in `name:` (one per method, N and seed)
            out[name] = run[1].strip()
    return out


def test_every_rule_runs_its_step_through_run_job_and_the_step_exists():
    rules = rules_with_runs()
    assert len(rules) >= 20
    assert set(rules.values()) == {RUN_JOB}
    for rule in rules:
        module = importlib.import_module(f"pipeline_src.steps.{step_of_rule(rule)}")
        assert callable(module.main), rule
    smk = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    assert "script:" not in smk and "shell:" not in smk  # a job's own client process: 0.18 CPU-s each
    assert not (REPO / "workflow" / "scripts").exists()


def test_step_of_rule():
    assert step_of_rule("train") == "train"
    assert step_of_rule("evaluate_soup") == "evaluate"
    assert step_of_rule("fuse") == "fusion.fuse"
    assert step_of_rule("train_vectorized_last-1_n4") == "train_vectorized"


def rule_blocks() -> dict[str, str]:
    """Rule name -> its block of workflow/rules/*.smk (named rules that run a step)."""
    out = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=\s*rule\b)", smk.read_text()):
            if (m := re.match(r"\s*rule\s*(\w+):", block)) and "run:" in block:
                out[m[1]] = block
    return out


def test_every_rule_whose_step_writes_per_image_records_declares_them():
    """A step that writes per-image records (store/per_image.py) on the test split has its rule
    declare them as the output `per_image`, at the path parallel to its metrics output (so
    Snakemake rebuilds a deleted one and a forced rerun replaces it); its validation twins
    (`split="val"`) write none and declare none."""
    from pipeline_src.store.per_image import per_image_path

    blocks, declared = rule_blocks(), set()
    for rule, block in blocks.items():
        module = importlib.import_module(f"pipeline_src.steps.{step_of_rule(rule)}")
        writes = "write_per_image(" in (REPO / module.__file__).read_text()
        per_image = re.search(r'^\s*per_image=f"([^"]+)"', block, re.M)
        if not writes or 'split="val"' in block:
            assert per_image is None, rule
            continue
        metrics = re.search(r'^\s*metrics=f"([^"]+)"', block, re.M)
        assert per_image and metrics, f"rule {rule}: its step writes per-image records; declare them as `per_image`"
        # the f-strings' text: the PRIVATE_METRICS shorthand spelled out
        metrics_path = metrics[1].replace("{PRIVATE_METRICS}", "{R}/metrics/private/{PRIVATE_LOG}")
        assert str(per_image_path(metrics_path)) == per_image[1], rule
        declared.add(rule)
    assert declared == {"evaluate_shards", "evaluate_soup", "unlearn_drop", "unlearn_retrain", "unlearn_paragon",
                        "unlearn_paragon_nonlinear", "evaluate_private", "fuse", "baseline_pixel_logreg",
                        "baseline_small_cnn"}
    # the report rule requests exactly their files (plan/per_image_files.py), so a deleted one is rebuilt
    folders = {re.search(r"/per_image/(\w+)/", re.search(r'^\s*per_image=f"([^"]+)"', blocks[r], re.M)[1])[1]
               for r in declared}
    assert folders == set(PER_IMAGE_STEPS)


def test_per_image_files_of_the_study_metrics():
    metrics = ["r/metrics/evaluate/fc/n1_s0/shards.parquet", "r/metrics/private/ours/taft-1/fc/eps1/n1_s0/shard0.parquet",
               "r/metrics/fuse/shared/nlft-1/n2_s0/none/soup.parquet", "r/metrics/ablation/taft-1/x/s0.parquet",
               "r/metrics/unlearn_drop/taft-1/n3_s0.parquet", "r/select/fc.parquet"]
    assert per_image_files(metrics, "r") == ["r/per_image/evaluate/fc/n1_s0/shards.parquet",
                                             "r/per_image/private/ours/taft-1/fc/eps1/n1_s0/shard0.parquet",
                                             "r/per_image/fuse/shared/nlft-1/n2_s0/none/soup.parquet",
                                             "r/per_image/unlearn_drop/taft-1/n3_s0.parquet"]


def test_the_fork_server_preloads_every_rules_step_but_the_reports():
    """A job's child imports nothing of its step (0.06-0.12 CPU-s a job before); the report's step,
    one job that imports matplotlib, is left to its job."""
    from pipeline_src.runner.forkserver import UNPRELOADED_STEPS, preload_steps

    names = set(preload_steps())
    for rule in rules_with_runs():
        module = f"pipeline_src.steps.{step_of_rule(rule)}"
        assert (module in names) == (module not in UNPRELOADED_STEPS), rule
    assert UNPRELOADED_STEPS == ("pipeline_src.steps.report",)
