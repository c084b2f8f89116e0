"""The tiny study's Snakefile parsed for real (Snakemake's API), in a fresh interpreter, for tests
of what the parse defines: its functions, and Snakemake's own objects built from its rules.

A fresh interpreter, since the parse sets up the process it runs in (held cache writes, the run's
owner, Ctrl-C forwarding, patches of Snakemake's classes), and later tests must not inherit that."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

PRELUDE = """\
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
    workflow = api.workflow(resource_settings=ResourceSettings(cores=1), storage_settings=StorageSettings(),
                            config_settings=ConfigSettings(configfiles=[Path("config.yaml").resolve()]),
                            snakefile=Path(%r), workdir=Path(".").resolve())._workflow
"""


def write_tiny_config(workdir: Path) -> None:
    """The tiny study's config (.test/config.yaml, on the CPU) as `workdir`/config.yaml."""
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["device"] = "cpu"
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))


def in_parsed_workflow(workdir: Path, code: str) -> dict:
    """Run `code` in a fresh interpreter after parsing the tiny study (.test/config.yaml, on the CPU)
    in `workdir`: `workflow` is Snakemake's Workflow, `workflow.globals` the Snakefile's namespace.
    `code` prints one JSON object last, which is returned.

    Args:
        workdir: the study's working directory (its config.yaml is written there).
        code: Python, run after the parse, at module level.
    """
    write_tiny_config(workdir)
    script = PRELUDE % str(REPO / "Snakefile") + code
    proc = subprocess.run([sys.executable, "-c", script], cwd=workdir, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode:
        raise AssertionError(f"the check failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
