"""Every query the README and the docs show runs on a finished study and returns rows (issue 33, item 8)."""
from __future__ import annotations

import shlex

import pytest

from pipeline_src.store import query
from tests.conftest import REPO, results_of

pytestmark = pytest.mark.e2e


def readme_queries() -> list[list[str]]:
    """The arguments of every `pipeline_src.store.query` command of one study in the README and the
    docs pages, as a shell reads them (commands over several studies: tests/e2e/test_studies.py)."""
    prefix = ".venv/bin/python -m pipeline_src.store.query "
    commands = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        commands += _queries(page.read_text().splitlines(), prefix)
    return [c for c in commands if not {"--all-studies", "--studies", "--compare"} & set(c)]


def _queries(lines: list[str], prefix: str) -> list[list[str]]:
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
    assert len(readme_queries()) >= 6  # --views, the README's three and the results page's, the environment's


@pytest.mark.parametrize("args", readme_queries(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_query_returns_rows(tiny_study, capsys, args):
    assert query.main([*args, "--results", str(results_of(tiny_study))]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert out.err == ""
    lines = [ln for ln in out.out.splitlines() if ln.strip()]
    assert len(lines) >= 2, out.out  # a header and at least one row (or two views)
    assert "Empty DataFrame" not in out.out


def test_the_composition_query_lists_compositions_of_one_split(tiny_study, capsys):
    sql = next(a[0] for a in readme_queries() if a and "model IN" in a[0])
    assert query.main(["--format", "csv", "--results", str(results_of(tiny_study)),
                       sql.replace("SELECT method, shards, model,", "SELECT method, shards, model, split,")]) == 0
    rows = [ln.split(",") for ln in capsys.readouterr().out.splitlines()[1:]]
    assert rows and {r[2] for r in rows} <= {"soup", "ensemble"} and {r[3] for r in rows} == {"test"}
