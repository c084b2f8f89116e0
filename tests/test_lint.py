"""`ruff check` (rules in pyproject.toml: pyflakes, import order, bugbear) is clean. ruff comes
with the `test` extra, so a missing ruff fails here instead of skipping."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
                         cwd=REPO, capture_output=True, text=True)
    assert "No module named ruff" not in out.stderr, "install the test extra: pip install -e '.[test]'"
    assert out.returncode == 0, out.stdout + out.stderr
