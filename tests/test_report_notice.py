"""The full report declares itself private workspace on its first line (docs/privacy.md)."""
from __future__ import annotations

from pipeline_src.steps.report import index_text


def test_the_reports_index_says_on_its_first_line_that_it_is_private():
    text = index_text(["- claims: [claims.md](claims.md)"])
    first = text.splitlines()[0]
    assert first.startswith("PRIVATE WORKSPACE: not releasable") and "release/" in first
    assert "- claims: [claims.md](claims.md)" in text
