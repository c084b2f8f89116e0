"""The documentation's shape (issue 35): a short README, one page per topic, and every shell or SQL
block marked as run by the tests or as needing something they lack.

A fenced block's info string is its language and one marker:

    ```bash runnable      run by tests/e2e/test_docs_blocks.py on the tiny study, as written
    ```bash long          a real study or benchmark: minutes to hours
    ```bash gpu           needs a CUDA GPU
    ```bash cluster       needs a Slurm cluster
    ```bash root          installs system packages (apt, as root)
    ```bash network       downloads (pretrained weights, packages)

A block without a language (program output, an error message) is not a command.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

COMMAND_LANGUAGES = {"bash", "sh", "shell", "console", "sql"}
MARKERS = {"runnable", "long", "gpu", "cluster", "root", "network"}
FENCE = re.compile(r"^[ \t]*```([^\n`]*)\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
README_MAX_LINES = 250


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int
    language: str
    markers: tuple[str, ...]
    text: str


def doc_pages() -> list[Path]:
    """README.md, CHANGELOG.md and every page under docs/."""
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file with a language, in order."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        words = m.group(1).split()
        if words:
            out.append(Block(str(path.relative_to(REPO)), text.count("\n", 0, m.start()) + 1, words[0],
                             tuple(words[1:]), m.group(2)))
    return out


def command_blocks() -> list[Block]:
    """The shell and SQL blocks of every page."""
    return [b for page in doc_pages() for b in blocks(page) if b.language in COMMAND_LANGUAGES]


def test_every_command_block_says_whether_the_tests_run_it():
    bad = [f"{b.page}:{b.line} ```{b.language} {' '.join(b.markers)}" for b in command_blocks()
           if len(b.markers) != 1 or b.markers[0] not in MARKERS]
    assert bad == [], f"give each block one marker of {sorted(MARKERS)}: " + "; ".join(bad)


def test_the_parser_sees_markers_and_skips_plain_blocks(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("x\n```bash runnable\necho hi\n```\n\n```\nplain output\n```\n```sql\nSELECT 1\n```\n")
    monkeypatch.setattr("tests.test_docs.REPO", tmp_path)
    found = blocks(page)
    assert [(b.line, b.language, b.markers, b.text) for b in found] == [
        (2, "bash", ("runnable",), "echo hi\n"), (9, "sql", (), "SELECT 1\n")]


def test_readme_is_short_and_in_the_issues_order():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    headings = [h.lower() for h in re.findall(r"^## (.+)$", text, re.M)]
    order = ["two commands", "own data", "cluster", "quer", "claims", "read more"]
    positions = [next((i for i, h in enumerate(headings) if word in h), None) for word in order]
    assert None not in positions and positions == sorted(positions), headings
    assert "docs/img/rulegraph.svg" in text and (REPO / "docs" / "img" / "rulegraph.svg").exists()


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown page (lower case, punctuation dropped, spaces to -)."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_local_link_resolves():
    """A link to a page or file of the repository names one that exists, and its #anchor a heading."""
    bad = []
    for page in doc_pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            dest = page.parent / file if file else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
                bad.append(f"{page.relative_to(REPO)}: {target}")
    assert bad == []


def test_anchors_follow_github():
    page_text = "# Top\n## Where a study's time goes\n## On a GPU (NVIDIA H200, 2026-11-26)\n## `last_grid`\n"
    assert anchors_of(page_text) == {"top", "where-a-studys-time-goes", "on-a-gpu-nvidia-h200-2026-11-26", "last_grid"}


def anchors_of(text: str) -> set[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".md") as f:
        f.write(text)
        f.flush()
        return anchors(Path(f.name))


def test_config_fragments_in_the_docs_are_valid():
    """A YAML block made of config keys (and no dataset of its own), laid over the default study,
    validates: the docs show no key or value the schema refuses."""
    import yaml

    from pipeline_src.plan.config import load_schema, validate_config

    top = set(load_schema()["properties"])
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    checked = 0
    for page in doc_pages():
        for b in blocks(page):
            fragment = yaml.safe_load(b.text) if b.language == "yaml" else None
            if not isinstance(fragment, dict) or not set(fragment) <= top or "dataset" in fragment:
                continue
            try:
                validate_config({**default, **fragment}, count_samples=False)
            except Exception as e:  # noqa: BLE001 (any refusal is the finding)
                raise AssertionError(f"{b.page}:{b.line}: {e}") from None
            checked += 1
    assert checked >= 4  # methods, fusion, privacy, LAST grid, forget


def test_the_readme_study_file_is_a_valid_config(tmp_path):
    """The README's own-data config validates as written, on a small ImageFolder of that layout
    (its path swapped for it; the timm name is checked, no weights are downloaded)."""
    import yaml
    from PIL import Image

    from pipeline_src.plan.config import validate_config

    readme = REPO / "README.md"
    (block,) = [b for b in blocks(readme) if b.language == "yaml" and "experiment: my-study" in b.text]
    cfg = yaml.safe_load(block.text)
    for label in ("cat", "dog", "fox"):
        (tmp_path / label).mkdir()
        for i in range(20):
            Image.new("RGB", (32, 32), (i * 12, 40, 90)).save(tmp_path / label / f"{i:02d}.png")
    assert cfg["dataset"]["path"] == "/data/my_images"
    cfg["dataset"]["path"] = str(tmp_path)
    full = validate_config(cfg)
    assert full["backbone"]["pretrained"] and full["shards"] == [1, 4] and len(full["methods"]) == 4
