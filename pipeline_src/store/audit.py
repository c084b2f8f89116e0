"""Audit a model's training data: did any of its components train on these sample ids?

    python -m pipeline_src.store.audit <model.safetensors> <ids file | id ...>

Every non-private trained model's record (`<model>.json`) lists the exact sample ids it trained
on; a DP model's record holds only a keyed ref into the results folder's private provenance store
(`private_provenance`), which the audit resolves. Every composed, fused or unlearned model lists
its components (recursively), resolved inside the model's own results tree. The audit walks that
tree and checks, at every node, the node's own recorded ids and its components. It proves
absence (exit 0) or names each component that trained on a requested id (exit 1). A composed
record whose ids are not the union of its components' ids is stale (a component changed after
composition) and is reported as a failure too, since then the tree proves nothing; the report
names the components whose sample count differs from the one the composed record lists. A model
whose tree cannot be read (a record or component missing, e.g. a copy kept outside its results
folder) ends with a one-line error, exit 2.

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
from pipeline_src.plan.studies import RESULTS, add_study_args, in_study
from pipeline_src.store.private_provenance import load_members, results_root_of


@dataclass
class AuditResult:
    """Outcome of an audit.

    Args:
        checked: every model file visited (the root and all components, depth first).
        hits: (model path, sorted requested ids it trained on) for every offending leaf.
        stale: (composed model path, what differs: the ids and the components holding them).
    """

    checked: list[str] = field(default_factory=list)
    hits: list[tuple[str, list[str]]] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.hits and not self.stale


def read_record(weights_path: Path) -> dict:
    path = weights_path.with_suffix(".json")
    if not path.is_file():
        raise FileNotFoundError(f"no record {path} beside the model {weights_path}")
    return json.loads(path.read_text())


def _component_path(component: str | dict) -> str:
    """Every composed kind records components as {"path", "shard_id", ...}; older fused records
    hold bare path strings."""
    return component if isinstance(component, str) else component["path"]


def _resolve(component: str, parent: Path) -> Path:
    """A component path as recorded (relative to the workflow directory, e.g. `results/train/...`)
    → the file in the composed model's OWN results tree: tried against each ancestor of the
    composed model, never against the current directory (an old copy is audited against its
    own components, not against today's files)."""
    p = Path(component)
    if p.is_absolute():
        return p
    for base in parent.resolve().parents:
        if (base / p).is_file():
            return base / p
    # A record of the old layout (before results/<experiment>/, docs/studies.md) names its
    # components results/<step>/...: moved by `studies move-old-layout`, they are <study>/<step>/...
    if p.parts[:1] == (RESULTS,) and len(p.parts) > 2:
        for base in parent.resolve().parents:
            if (base / p.relative_to(RESULTS)).is_file():
                return base / p.relative_to(RESULTS)
    raise FileNotFoundError(f"component {component} of {parent} is in no folder above it: the audit reads a "
                            "model's components from its own results folder, so audit a copy inside a copy of "
                            "that folder")


def members_of(path: Path, record: dict) -> set[str] | None:
    """A node's recorded members: its `sample_ids`, or (DP models) the private store's ids behind
    its keyed `membership_ref`; None when it records neither."""
    if "membership_ref" in record:
        return set(load_members(results_root_of(path), record["membership_ref"]))
    if "sample_ids" in record:
        return set(record["sample_ids"])
    return None


def _describe_stale(own: set[str], by_component: dict[str, set[str]], counts_then: dict[str, int]) -> str:
    """What differs between a composed record and its components today, naming the components.

    Args:
        own: the ids the composed record lists.
        by_component: each component's ids today.
        counts_then: each component's sample count as the composed record lists it (when it does).
    """
    seen = set().union(*by_component.values()) if by_component else set()
    parts = []
    changed = [comp for comp, ids in by_component.items() if comp in counts_then and counts_then[comp] != len(ids)]
    for comp in changed:
        parts.append(f"component {comp} trained on {counts_then[comp]} samples when composed, "
                     f"{len(by_component[comp])} now")
    for comp, ids in by_component.items():
        extra = sorted(ids - own)
        if extra:
            parts.append(f"component {comp} trained on {len(extra)} id(s) the composition does not record: "
                         f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    missing = sorted(own - seen)
    if missing:
        shrunk = [c for c in changed if counts_then[c] > len(by_component[c])]
        held = f" (held then by {', '.join(shrunk)})" if shrunk else ""
        parts.append(f"{len(missing)} recorded id(s) no component trains on now{held}: {', '.join(missing[:5])}"
                     f"{' ...' if len(missing) > 5 else ''}")
    return "; ".join(parts)


def audit_model(model_path: str | Path, ids: Sequence[str]) -> AuditResult:
    """Check a trained, composed, fused, unlearned or DP model against sample ids.

    Args:
        model_path: a `.safetensors` model written by `model_io.save_model`.
        ids: the sample ids that must not have been trained on.
    """
    wanted = set(ids)
    result = AuditResult()

    def visit(path: Path) -> set[str]:
        record = read_record(path)
        result.checked.append(str(path))
        own = members_of(path, record)
        components = record.get("components")
        if not components:
            if own is None:
                raise ValueError(f"{path} records neither sample ids, a membership ref nor components")
            if own & wanted:
                result.hits.append((str(path), sorted(own & wanted)))
            return own
        by_component, counts_then = {}, {}
        for comp in components:
            comp_path = _resolve(_component_path(comp), path)
            by_component[str(comp_path)] = visit(comp_path)
            if isinstance(comp, dict) and "num_samples" in comp:
                counts_then[str(comp_path)] = int(comp["num_samples"])
        seen = set().union(*by_component.values())
        if own is not None and own != seen:
            result.stale.append((str(path), _describe_stale(own, by_component, counts_then)))
        return seen

    visit(Path(model_path))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline_src.store.audit", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .safetensors model with its .json record beside it")
    parser.add_argument("ids", nargs="+", help="a request file (text or CSV) or sample ids")
    add_study_args(parser)  # --study / --configfile: `model` is then a path inside that study's folder
    a = parser.parse_args(argv)
    a.model = in_study(a.model, a)
    try:
        ids = read_request(a.ids[0]) if len(a.ids) == 1 and Path(a.ids[0]).is_file() else list(a.ids)
        result = audit_model(a.model, ids)
    except (OSError, ValueError) as e:  # a bad request file, a missing record or component: one line
        print(f"audit: {e}", file=sys.stderr)
        return 2
    leaves = len(result.checked)
    for path, hit in result.hits:
        print(f"TRAINED ON {len(hit)} of the ids: {path}: {', '.join(hit[:10])}{' ...' if len(hit) > 10 else ''}")
    for path, why in result.stale:
        print(f"STALE: {path} records sample ids that differ from its components': {why}")
    if result.clean:
        print(f"clean: none of {leaves} model files under {a.model} trained on any of the {len(set(ids))} ids")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
