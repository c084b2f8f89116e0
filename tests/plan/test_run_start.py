"""The files a killed run had deleted to rebuild: from Snakemake's records, and from the journal a
run writes before its first job, since Snakemake deletes outputs before it marks them incomplete."""
from __future__ import annotations

from base64 import urlsafe_b64encode
from pathlib import Path

from pipeline_src.plan.run_start import REBUILD_JOURNAL, journal_rebuilds, killed_rebuilds, settle_journal


def record(smk: Path, kind: str, name: str) -> None:
    (smk / kind).mkdir(parents=True, exist_ok=True)
    (smk / kind / urlsafe_b64encode(name.encode()).decode()).write_text("{}")


def study(tmp_path, monkeypatch) -> tuple[Path, list[str]]:
    monkeypatch.chdir(tmp_path)
    files = ["results/x/train/a.safetensors", "results/x/train/b.safetensors", "results/y/train/c.safetensors"]
    for f in files:
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        Path(f).write_text("w")
    return Path(".snakemake"), files


def test_a_journaled_file_deleted_before_it_was_marked_incomplete_is_rebuilt(tmp_path, monkeypatch):
    smk, (a, b, c) = study(tmp_path, monkeypatch)
    smk.mkdir()
    journal_rebuilds("results/x", [a, b, c, "results/x/never_built.json"], smk)
    assert (smk / REBUILD_JOURNAL).read_text().splitlines() == [a, b]  # existing, under this study
    assert killed_rebuilds("results/x", smk) == []
    Path(a).unlink()  # Snakemake deleted it, then the run was killed: no incomplete marker, no record
    assert killed_rebuilds("results/x", smk) == [a]
    assert killed_rebuilds("results/y", smk) == []


def test_a_run_that_ends_keeps_only_what_is_still_missing(tmp_path, monkeypatch):
    smk, (a, b, _) = study(tmp_path, monkeypatch)
    smk.mkdir()
    journal_rebuilds("results/x", [a, b], smk)
    Path(a).unlink()
    settle_journal(smk)  # the run ended (its job failed, say): a stays, b was rebuilt
    assert (smk / REBUILD_JOURNAL).read_text().splitlines() == [a]
    journal_rebuilds("results/x", [], smk)  # the next run starts: the missing entry stays
    assert killed_rebuilds("results/x", smk) == [a]
    Path(a).write_text("w")
    settle_journal(smk)
    assert not (smk / REBUILD_JOURNAL).exists()
    Path(b).unlink()  # a user removed a file after a run that ended: not rebuilt behind their back
    assert killed_rebuilds("results/x", smk) == []


def test_an_incomplete_file_with_a_record_is_rebuilt_only_when_missing(tmp_path, monkeypatch):
    smk, (a, b, _) = study(tmp_path, monkeypatch)
    for f in (a, b):
        record(smk, "incomplete", f)
    record(smk, "metadata", a)  # b never finished a build
    Path(a).unlink(), Path(b).unlink()
    assert killed_rebuilds("results/x", smk) == [a]
