"""docs/configuration.md is generated from the config schema and matches it (issue 35)."""
from __future__ import annotations

import copy

from pipeline_src.plan import config_docs


def test_the_committed_page_matches_the_schema():
    page = config_docs.render(config_docs.load_schema())
    assert config_docs.PAGE.read_text() == page, (
        "docs/configuration.md is stale: run `python -m pipeline_src.plan.config_docs` and commit it")


def test_every_key_of_the_schema_has_a_row_with_its_default():
    schema = config_docs.load_schema()
    page = config_docs.render(schema)
    assert "| `dataset.img_size` | integer (≥ 4) | `16` |" in page
    assert "| `methods.<name>.k` | integer (≥ 1) |" in page
    assert "| `backbone.pretrain.schedule.name` | `constant` \\| `step` \\| `cosine` | `constant` |" in page  # a $ref
    assert "| `experiment` | string | *required* |" in page


def test_a_new_key_or_default_changes_the_page():
    """The check can fail: a schema edit the page does not show makes it stale."""
    schema = config_docs.load_schema()
    edited = copy.deepcopy(schema)
    edited["properties"]["train"]["properties"]["epochs"]["default"] = 16
    assert "| `train.epochs` | integer (≥ 1) | `16` |" in config_docs.render(edited)
    edited["properties"]["features"]["properties"]["new_key"] = {"type": "boolean", "default": True,
                                                               "description": "a | pipe"}
    assert "| `features.new_key` | boolean | `true` | a \\| pipe |" in config_docs.render(edited)
    assert config_docs.render(edited) != config_docs.render(schema)


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    page = tmp_path / "configuration.md"
    monkeypatch.setattr(config_docs, "PAGE", page)
    assert config_docs.main(["--check"]) == 1  # missing
    assert config_docs.main([]) == 0 and page.exists()
    assert config_docs.main(["--check"]) == 0
    page.write_text(page.read_text() + "edited by hand\n")
    assert config_docs.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
