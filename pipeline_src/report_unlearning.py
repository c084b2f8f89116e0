"""Reports of the unlearning study (see pipeline_src/report.py for the report interface)."""
from __future__ import annotations

REPORTS: dict = {}
