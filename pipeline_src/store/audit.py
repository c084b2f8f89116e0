"""Audit a model's training data: did any of its components train on these sample ids?

    python -m pipeline_src.store.audit <model.safetensors> <ids file | id ...>

Every trained model's record (`<model>.json`) lists the exact sample ids it trained on, and
every composed or unlearned model lists its components (recursively). The audit walks that
tree and checks, at every node, the node's own recorded ids and its components. It proves
absence (exit 0) or names each component that trained on a requested id (exit 1). A composed
record whose ids are not the union of its components' ids is stale (a component changed after
composition) and is reported as a failure too, since then the tree proves nothing.

Paper context: SISA's exact unlearning (Bourtoule et al., IEEE S&P 2021) and TAFT's removal by
subtraction (Liu, Soatto et al., ICLR 2024) are exact only if no remaining component saw the ids.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipeline_src.plan.forget import read_request


@dataclass
class AuditResult:
    """Outcome of an audit.

    Args:
        checked: every model file visited (the root and all components, depth first).
        hits: (model path, sorted requested ids it trained on) for every offending leaf.
        stale: composed models whose recorded ids disagree with their components.
    """

    checked: list[str] = field(default_factory=list)
    hits: list[tuple[str, list[str]]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.hits and not self.stale


def _record(weights_path: Path) -> dict:
    path = weights_path.with_suffix(".json")
    if not path.is_file():
        raise FileNotFoundError(f"audit: no record {path} beside the model {weights_path}")
    return json.loads(path.read_text())


def _resolve(component: str, parent: Path) -> Path:
    """A component path as recorded (relative to the workflow directory) → an existing file:
    tried as given, then against each ancestor directory of the composed model."""
    p = Path(component)
    if p.is_absolute() or p.is_file():
        return p
    for base in parent.resolve().parents:
        if (base / p).is_file():
            return base / p
    raise FileNotFoundError(f"audit: component {component} of {parent} not found")


def audit_model(model_path: str | Path, ids: Sequence[str]) -> AuditResult:
    """Check a trained, composed or unlearned model against sample ids.

    Args:
        model_path: a `.safetensors` model written by `model_io.save_model`.
        ids: the sample ids that must not have been trained on.
    """
    wanted = set(ids)
    result = AuditResult()

    def visit(path: Path) -> set[str]:
        record = _record(path)
        result.checked.append(str(path))
        own = set(record.get("sample_ids", []))
        components = record.get("components")
        if not components:
            if "sample_ids" not in record:
                raise ValueError(f"audit: {path} records neither sample ids nor components")
            if own & wanted:
                result.hits.append((str(path), sorted(own & wanted)))
            return own
        seen: set[str] = set()
        for comp in components:
            seen |= visit(_resolve(comp["path"], path))
        if "sample_ids" in record and own != seen:
            result.stale.append(str(path))
        return seen

    visit(Path(model_path))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline_src.store.audit", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .safetensors model with its .json record beside it")
    parser.add_argument("ids", nargs="+", help="a request file (text or CSV) or sample ids")
    a = parser.parse_args(argv)
    ids = read_request(a.ids[0]) if len(a.ids) == 1 and Path(a.ids[0]).is_file() else list(a.ids)
    result = audit_model(a.model, ids)
    leaves = len(result.checked)
    for path, hit in result.hits:
        print(f"TRAINED ON {len(hit)} of the ids: {path}: {', '.join(hit[:10])}{' ...' if len(hit) > 10 else ''}")
    for path in result.stale:
        print(f"STALE: {path} records sample ids that differ from the union of its components'")
    if result.clean:
        print(f"clean: none of {leaves} model files under {a.model} trained on any of the {len(set(ids))} ids")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
