"""What leaves a DP study, scanned (docs/privacy.md, "Threat model"): a tiny DP study built from
scratch by real Snakemake (one method, N = 1, one DP model; the report and the release), under
umask 022. While it runs, nothing under its results folder or `.snakemake/` is ever open to the
group or others (Snakemake's metadata included). Then:
- the release and a DP model's export hold no member id, no true size n or images count, no
  figure or key of non-DP training and no unkeyed SHA-256 of any id list;
- `snakemake --report` (which embeds the efficiency table, n-dependent, and every non-DP table)
  opens on the PRIVATE WORKSPACE mark, and is owner-only;
- a non-DP model's export is refused without `--export-non-private-model`, and marked private
  workspace with it; every export is owner-only;
- the private workspace itself (`.snakemake/`, `signatures/`, everything under the results folder
  but the provenance store) holds no unkeyed SHA-256 of an id list either: its rerun triggers are
  keyed with the provenance key.
"""
from __future__ import annotations

import csv
import hashlib
import hmac
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, SNAKEMAKE, planned_outputs, results_of, snakemake
from tests.e2e.conftest import tiny_dp_config

pytestmark = pytest.mark.e2e
MARK = "PRIVATE WORKSPACE: not releasable"
DP_MODEL = "private/ours/taft-1/fc/eps8/n1_s0/shard0.safetensors"
NON_DP_MODEL = "train/taft-1/n1_s0/shard0.safetensors"


BEFORE_THE_PARSE = {".snakemake", ".snakemake/log"}  # Snakemake makes them 0755 (an empty log inside) before
# the Snakefile runs; its first lines close them (plan/private_workspace.close_snakemake_log)


def _open_paths(roots: list[Path], while_running: bool = False) -> set[str]:
    """Paths under `roots` (links aside) with a group or other bit; ones removed meanwhile are skipped.
    While the run goes, an empty file and the folders Snakemake makes before the parse do not count:
    what must be closed is every byte."""
    found = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for p in [dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))]:
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                rel = os.path.relpath(p, root.parent)
                if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                    continue
                if while_running and (rel in BEFORE_THE_PARSE or (stat.S_ISREG(st.st_mode) and not st.st_size)):
                    continue
                found.add(f"{rel} {stat.S_IMODE(st.st_mode):o}")
    return found


def _run_watched(workdir: Path) -> tuple[set[str], int]:
    """Run the study, listing every open path seen while it runs; (open paths, metadata records seen)."""
    roots = [workdir / ".snakemake", results_of(workdir)]
    proc = subprocess.Popen([*SNAKEMAKE, "--directory", str(workdir), "--cores", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    seen, records = set(), 0
    while proc.poll() is None:
        seen |= _open_paths(roots, while_running=True)
        metadata = workdir / ".snakemake" / "metadata"
        records = max(records, len(os.listdir(metadata)) if metadata.is_dir() else 0)
        time.sleep(0.1)
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    return seen | _open_paths(roots), records


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    old = os.umask(0o022)  # the usual umask: only the study's own modes keep its files closed
    try:
        workdir = tmp_path_factory.mktemp("dp_workspace")
        (workdir / "config.yaml").write_text(json.dumps(tiny_dp_config()))
        open_paths, records = _run_watched(workdir)
        report = snakemake(workdir, "--report", "report.html")
        exports = workdir / "exports"
        runs = {name: subprocess.run([sys.executable, "-m", "pipeline_src.methods.export",
                                      str(results_of(workdir) / model), str(exports / name), *flag],
                                     capture_output=True, text=True, cwd=workdir,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
                for name, model, flag in (("dp", DP_MODEL, []), ("refused", NON_DP_MODEL, []),
                                          ("non_dp", NON_DP_MODEL, ["--export-non-private-model"]))}
    finally:
        os.umask(old)
    return {"workdir": workdir, "open_paths": open_paths, "records": records, "report_log": report.stdout +
            report.stderr, "exports": exports, "runs": runs}


def _what_must_not_leave(workdir: Path) -> dict[str, list[str]]:
    """Strings whose presence in a releasable file would speak for members: every listed id, the
    unkeyed digests of id lists (all ids, the shard's, the backbone's), the true sizes and image
    counts (as whole numbers), and the keys and paths of non-DP training."""
    results = results_of(workdir)
    ids = pq.read_table(results / "prepare" / "samples.parquet").column("sample_id").to_pylist()
    shard = pq.read_table(results / "split" / "n1_s0" / "shard0.parquet").column("sample_id").to_pylist()
    source = (results / "pretrain" / "source_ids.txt").read_text().split()
    digests = [hashlib.sha256("\n".join(sorted(group)).encode()).hexdigest() for group in (ids, shard, source)]
    with open(results / "report" / "efficiency.csv") as f:
        images = {int(float(r["images"])) for r in csv.DictReader(f) if r["images"]}
    sizes = {len(ids), len(shard), *images} - {500}  # 500: the declared public size, released on purpose
    return {"member id": ids, "unkeyed digest": digests, "size": [str(n) for n in sorted(sizes)],
            "non-DP key": ["sample_ids", "num_samples", "wall_time", "membership_ref", f"{results.name}/train/"]}


def _text_of(f: Path, data: bytes) -> str:
    """What a reader sees as text: a text file whole, a safetensors file's header (its tensors'
    bytes would match short numbers by chance)."""
    if f.suffix == ".safetensors":
        data = data[8:8 + int.from_bytes(data[:8], "little")]
    return data.decode("utf-8", errors="replace")


def _scan(folder: Path, forbidden: dict[str, list[str]]) -> list[str]:
    hits = []
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = f.read_bytes()
        text = _text_of(f, data)
        for kind, values in forbidden.items():
            for v in values:
                found = re.search(rf"(?<![\d.]){v}(?![\d])", text) if kind == "size" else v.encode() in data
                if found:
                    hits.append(f"{f.relative_to(folder)}: {kind} {v[:40]}")
    return hits


def test_nothing_of_the_study_is_ever_open_to_others_while_it_runs(study):
    assert study["records"] > 5, "the watch saw Snakemake write its metadata"
    assert study["open_paths"] == set()


def test_the_release_and_a_dp_export_speak_for_no_member(study):
    workdir, forbidden = study["workdir"], _what_must_not_leave(study["workdir"])
    assert len(forbidden["member id"]) > 500 and len(forbidden["size"]) >= 2
    for folder in (results_of(workdir) / "release", study["exports"] / "dp"):
        assert len([p for p in folder.rglob("*") if p.is_file()]) >= 4, folder
        assert _scan(folder, forbidden) == [], folder
    assert _open_paths([study["exports"] / "dp"]) == set()  # exported under umask 022, still owner-only


def test_the_scan_finds_what_the_private_workspace_holds(study):
    """The scan is not blind: the non-DP export (private workspace) holds member ids and sizes."""
    hits = _scan(study["exports"] / "non_dp", _what_must_not_leave(study["workdir"]))
    assert any(": member id " in h for h in hits) and any(": non-DP key sample_ids" in h for h in hits)


def test_the_html_report_opens_on_the_private_workspace_mark(study):
    workdir = study["workdir"]
    assert "Adding efficiency.csv" in study["report_log"]  # n-dependent: why the mark is needed
    html = (workdir / "report.html").read_text(errors="replace")
    desc = json.loads(re.search(r"var workflow_desc = (\".*?\");\n", html).group(1))  # the landing screen's text
    assert f'<h1 class="title">{MARK}</h1>' in desc and f"results/{results_of(workdir).name}/release/" in desc
    assert stat.S_IMODE((workdir / "report.html").stat().st_mode) == 0o600
    assert (results_of(workdir) / "report" / "index.md").read_text().startswith("PRIVATE WORKSPACE")


def test_a_non_dp_model_leaves_only_with_the_flag_marked_and_owner_only(study):
    assert (results_of(study["workdir"]) / "provenance" / "dp_study.txt").is_file()  # the study's mark
    refused, flagged = study["runs"]["refused"], study["runs"]["non_dp"]
    assert refused.returncode == 2 and "--export-non-private-model" in refused.stderr
    assert not (study["exports"] / "refused").exists()
    assert flagged.returncode == 0 and "WARNING: PRIVATE WORKSPACE" in flagged.stderr
    assert (study["exports"] / "non_dp" / "PRIVATE_WORKSPACE.txt").is_file()
    assert _open_paths([study["exports"] / "non_dp"]) == set()


def test_snakemakes_folder_is_owner_only_after_the_run(study):
    assert _open_paths([study["workdir"] / ".snakemake", results_of(study["workdir"])]) == set()


def _id_lists(workdir: Path) -> dict[str, list[str]]:
    """The id lists whose digests were the workspace's rerun triggers: every shard manifest's
    members, the pretraining data's ids (the upstream signature's `pretrain_data`) and the whole
    listing (the `prepare` job's `listing` param)."""
    results = results_of(workdir)
    samples = pq.read_table(results / "prepare" / "samples.parquet").to_pydict()
    lists = {f"shard {p.relative_to(results / 'split')}": pq.read_table(p).column("sample_id").to_pylist()
             for p in sorted((results / "split").rglob("shard*.parquet"))}
    lists["pretraining data"] = [i for i, t in zip(samples["sample_id"], samples["task"]) if t == "source"]
    lists["listing"] = samples["sample_id"]
    return lists


def _workspace_files(workdir: Path) -> list[Path]:
    """Every file of `.snakemake/` and of the results folder but the provenance store (which holds
    the key and the DP members themselves)."""
    results = results_of(workdir)
    return [p for root in (workdir / ".snakemake", results) for p in sorted(root.rglob("*"))
            if p.is_file() and (results / "provenance") not in p.parents]


def test_the_workspace_holds_no_unkeyed_digest_of_an_id_list(study):
    """Issue 43: a plain SHA-256 of sorted ids lets whoever guesses a member list confirm it. The
    scan is not blind: the same lists' keyed digests (HMAC-SHA256, the provenance key) are where the
    plain ones were, the listing's in the `prepare` job's metadata, the pool's in `upstream.json`."""
    workdir = study["workdir"]
    lists = _id_lists(workdir)
    assert len(lists) == 3 and all(len(ids) > 100 for ids in lists.values())
    files = _workspace_files(workdir)
    assert any("signatures" in p.parts for p in files) and sum("metadata" in p.parts for p in files) > 5
    plain = {name: hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest() for name, ids in lists.items()}
    hits = [f"{p.relative_to(workdir)}: {name}" for p in files for name, digest in plain.items()
            if digest.encode() in p.read_bytes()]
    assert not hits, "\n".join(hits)
    key = (results_of(workdir) / "provenance" / "key").read_bytes()
    keyed = {name: hmac.new(key, "\n".join(sorted(ids)).encode(), hashlib.sha256).hexdigest()
             for name, ids in lists.items()}
    upstream = json.loads((results_of(workdir) / "signatures" / "upstream.json").read_text())
    assert upstream["pretrain_data"] == keyed["pretraining data"]
    assert any(keyed["listing"].encode() in p.read_bytes() for p in files if "metadata" in p.parts)
    dry = snakemake(workdir, "-n", "--cores", "2")  # the keyed triggers are stable: nothing reruns
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_switching_privacy_off_keeps_the_keyed_triggers(study):
    """The folder keeps its key: the listing and upstream triggers stay as they are, so neither
    `prepare` nor the upstream signature (nor what depends on them) reruns, and no plain digest
    would be written into the former DP study's workspace."""
    dry = snakemake(study["workdir"], "-n", "--cores", "2", "--config", "privacy={enabled: false}")
    planned = planned_outputs(dry)
    results = f"results/{results_of(study['workdir']).name}"
    assert not [o for o in planned if o.startswith((f"{results}/prepare/", f"{results}/signatures/upstream",
                                                      f"{results}/pretrain/", f"{results}/train/"))], planned
