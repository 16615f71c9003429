"""The manual's links hold: every relative link in README.md and docs/ names a file that exists (and
a heading of it, where the link names one), and every page of docs/ says first what it covers."""

from __future__ import annotations

import glob
import os
import re

import pytest

from tests.support.trainer_runs import REPOSITORY

PAGES = [os.path.join(REPOSITORY, "README.md")] + sorted(
    glob.glob(os.path.join(REPOSITORY, "docs", "*.md"))
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces
    to dashes."""
    with open(path) as file:
        headings = re.findall(r"^#+ (.+)$", file.read(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda path: os.path.relpath(path, REPOSITORY))
def test_every_relative_link_resolves(page):
    with open(page) as file:
        text = file.read()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(resolved):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES[1:], ids=os.path.basename)
def test_every_page_says_what_it_covers(page):
    with open(page) as file:
        opening = file.read().split("\n\n")[1]
    assert opening.startswith("What this page covers")
