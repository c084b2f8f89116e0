"""Provenance: the git commit recorded with every model (the tensors' digest is
`pipeline_src.vit.digest.state_digest`)."""
from __future__ import annotations

from pipeline_src.plan.environment import PACKAGE_ROOT, git_commit  # noqa: F401 (re-exported: recorded with models)
