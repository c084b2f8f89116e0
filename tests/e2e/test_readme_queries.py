"""Every query the README shows runs on a finished study and returns rows (issue 33, item 8)."""
from __future__ import annotations

import shlex

import pytest

from pipeline_src.store import query
from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def readme_queries() -> list[list[str]]:
    """The arguments of every `pipeline_src.store.query` command in the README, as a shell reads them."""
    lines = (REPO / "README.md").read_text().splitlines()
    prefix = ".venv/bin/python -m pipeline_src.store.query "
    commands = []
    for i, line in enumerate(lines):
        if not line.startswith(prefix):
            continue
        text = line[len(prefix):]
        while True:  # a quoted query goes on over the next lines
            try:
                commands.append(shlex.split(text, comments=True))
                break
            except ValueError:
                i += 1
                text += "\n" + lines[i]
    return commands


def test_the_readme_has_its_queries():
    assert len(readme_queries()) >= 6  # --views, three of the results section, two of the environment


@pytest.mark.parametrize("args", readme_queries(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_query_returns_rows(tiny_study, capsys, args):
    assert query.main([*args, "--results", str(tiny_study / "results")]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert out.err == ""
    lines = [ln for ln in out.out.splitlines() if ln.strip()]
    assert len(lines) >= 2, out.out  # a header and at least one row (or two views)
    assert "Empty DataFrame" not in out.out


def test_the_composition_query_lists_compositions_of_one_split(tiny_study, capsys):
    sql = next(a[0] for a in readme_queries() if a and "model IN" in a[0])
    assert query.main(["--format", "csv", "--results", str(tiny_study / "results"),
                       sql.replace("SELECT method, shards, model,", "SELECT method, shards, model, split,")]) == 0
    rows = [ln.split(",") for ln in capsys.readouterr().out.splitlines()[1:]]
    assert rows and {r[2] for r in rows} <= {"soup", "ensemble"} and {r[3] for r in rows} == {"test"}
