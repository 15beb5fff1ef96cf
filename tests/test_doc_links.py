"""The README's and docs/' references resolve: every relative Markdown link, and every path named in backticks
under docs/, bench/ or tests/fixtures/ (a renamed file or fixture leaves no dangling mention)."""

import re

from conftest import REPO

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
NAMED_PATH = re.compile(r"`((?:docs|bench|tests/fixtures)/[^`\s*{}<>]+)`")


def _documents():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _dangling(document):
    text = document.read_text()
    for target in MARKDOWN_LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (document.parent / target.split("#")[0]).exists():
            yield target
    for named in NAMED_PATH.findall(text):
        path = named.split("::")[0].rstrip(".,;:")
        if not (REPO / path).exists():
            yield named


def test_every_link_and_named_path_in_the_docs_resolves():
    dangling = {str(d.relative_to(REPO)): sorted(set(_dangling(d))) for d in _documents()}
    assert not {name: targets for name, targets in dangling.items() if targets}
