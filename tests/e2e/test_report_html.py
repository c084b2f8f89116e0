"""`snakemake --report report.html` on a finished study: Snakemake's self-contained HTML report.

The `report` rule flags its output folder's tables (csv) and plots (png) with
`report(directory(...), patterns=..., caption=...)`; a wrong
caption path or a missing report plugin only shows when the HTML report is built, which no
`snakemake --cores` run does. The study is the tiny `.test` config cut down to one method, with
the fusion and forget studies off, so it runs in a minute or two: the report rule and its
captions are the same for every method.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e



def small_config() -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    method = "fc" if "fc" in cfg["methods"] else next(iter(cfg["methods"]))
    cfg["methods"] = {method: cfg["methods"][method]}
    cfg["search"] = {"enabled": False}  # it names methods cut here (tests/e2e/test_search.py runs it)
    for study in ("fusion", "privacy", "last_grid"):
        if isinstance(cfg.get(study), dict):
            cfg[study]["enabled"] = False
    if isinstance(cfg.get("forget", {}).get("study"), dict):
        cfg["forget"]["study"]["enabled"] = False
    return cfg


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_study) -> Path:
    workdir = copy_study(tiny_study, tmp_path_factory.mktemp("report_study"), parts=None)  # its trained models too
    (workdir / "config.yaml").write_text(yaml.safe_dump(small_config()))
    snakemake(workdir, "--cores", "2", timeout=1200)
    return workdir


def test_html_report_of_the_finished_study(study):
    proc = snakemake(study, "--report", "report.html", timeout=1200)
    log = proc.stdout + proc.stderr
    html = study / "report.html"
    assert html.stat().st_size > 10_000, log
    assert "Adding accuracy.csv" in log and "Adding accuracy.png" in log, log
    text = html.read_text(errors="replace")
    assert "accuracy.png" in text and "accuracy.csv" in text and "table2_composition.csv" in text
    caption = (REPO / "workflow" / "report" / "reports.rst").read_text().split()
    assert " ".join(caption[:5]) in text  # the caption was found and rendered
    assert '"rule": "report"' in text  # runtime statistics of the report job

