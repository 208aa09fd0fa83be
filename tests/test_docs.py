"""Every relative link in the README and the documentation pages names a file that exists, and a link into a
Markdown page names one of its headings: pages move and split, and a link left behind is found here, not by a
reader. Links to other sites are not followed; fenced code blocks are not prose and are skipped."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^()\s]+)\)")  # [text](target) and ![alt](target); the text may span lines
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")  # https:, mailto:, ...


def prose(page: Path) -> str:
    """The page's text without its fenced code blocks."""
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def broken_links(page: Path) -> list[str]:
    """The relative links of `page` whose file does not exist, or whose anchor is no heading of the Markdown page
    it names."""
    broken = []
    for target in LINK.findall(prose(page)):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in {slug(h) for h in HEADING.findall(prose(file))}:
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_names_an_existing_file(page):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n[ok](other.md#a-heading) [ok](#here) [ok](https://example.org/gone)\n"
        "[gone](missing.md) ![no such\nfigure](fig.png) [no heading](other.md#nowhere) [none here](#nowhere)\n"
        "```\n[in code](not/checked.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md", "fig.png", "other.md#nowhere", "#nowhere"]
