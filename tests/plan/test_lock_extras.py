"""The default install leaves the optional Slurm extra out of the lock (issue 44)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline_src.plan.conda_env import lock_parents
from pipeline_src.plan.environment import LOCK_FILE, PYPROJECT, lock_drift, read_lock
from pipeline_src.plan.lock_extras import extra_only_pins, lock_without
from tests.conftest import REPO

SLURM_PINS = {"snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep"}


def test_the_default_requirements_are_the_lock_without_the_slurm_plugins(tmp_path):
    assert extra_only_pins(("slurm",), LOCK_FILE, PYPROJECT) == SLURM_PINS
    out = tmp_path / "requirements-default.txt"
    # run as the Makefile does, by an interpreter without site-packages (before anything is installed)
    subprocess.run([sys.executable, "-S", "-m", "pipeline_src.plan.lock_extras", "--without", "slurm", str(LOCK_FILE),
                    "--out", str(out)], cwd=REPO, check=True, capture_output=True)
    kept, full = read_lock(out), read_lock(LOCK_FILE)
    assert set(full) - set(kept) == SLURM_PINS
    assert all(kept[n] == v for n, v in full.items() if n not in SLURM_PINS)
    # every pin left out is needed by nothing kept, so `pip install --require-hashes` finds every dependency
    for name, parents in lock_parents(LOCK_FILE).items():
        if name in kept:
            continue
        assert not parents & set(kept), (name, parents & set(kept))


def _entries(text: str) -> list[str]:
    """The lock's entries: a pin line with its hash and `# via` lines (the header is one entry too)."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            blocks.append([])
        blocks[-1].append(line)
    return ["\n".join(b) for b in blocks]


def test_each_kept_entry_is_kept_whole_with_its_hashes():
    full = _entries(LOCK_FILE.read_text())
    expected = [e for e in full if not any(e.startswith(f"{name}==") for name in SLURM_PINS)]
    assert len(full) - len(expected) == 2 and _entries(lock_without(("slurm",))) == expected


def test_an_uninstalled_pin_of_the_extra_is_no_drift_but_one_of_the_default_install_is(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT.read_text().replace('slurm = ["snakemake-executor-plugin-slurm>=1.0"]',
                                                      'slurm = ["snakemake-executor-plugin-slurm>=1.0", "no-such-plugin>=1"]'))
    entry = "no-such-plugin==1.0 \\\n    --hash=sha256:00\n    # via vit-compose-pipeline (pyproject.toml)\n"
    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK_FILE.read_text() + entry)
    assert all(name != "no-such-plugin" for name, *_ in lock_drift(lock, pyproject))
    assert ("no-such-plugin", "1.0", None) in lock_drift(lock, PYPROJECT)  # not an extra's: drift


def test_the_makefile_installs_the_default_requirements_and_install_slurm_the_whole_lock():
    makefile = (REPO / "Makefile").read_text()
    install = makefile[makefile.index("$(BIN)/.installed:"):makefile.index("install: $(BIN)/.installed")]
    assert "--without slurm" in install and "-r $(LOCK)" not in install
    assert "install-slurm: install\n\t$(BIN)/pip install --require-hashes -r $(LOCK)" in makefile
    assert "make install-slurm" in Path(REPO / ".ci" / "run").read_text()
    assert "--extra slurm" in makefile  # `make lock` resolves the extra, so its pins agree with the rest
