"""The README and docs/ as a newcomer meets them: every relative link lands on a file and a heading
that exist, and the README's first commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from commands import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """The text a reader sees as prose: a link written inside code is an example, not a link."""
    text = FENCE.sub("", text)
    lines = [line for line in text.splitlines() if not line.startswith("    ")]
    return CODE_SPAN.sub("", "\n".join(lines))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page offers, a repeated heading numbered as GitHub numbers it (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def broken_links(page: Path) -> list[str]:
    """The page's relative links that name a missing file, or a heading its target does not have."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not this test's to judge
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target} (no such heading)")
    return broken


def test_the_slug_is_githubs() -> None:
    """Anchors are computed, not copied, so the rule must be the one GitHub renders headings with."""
    assert slug("Against llama.cpp's own tools") == "against-llamacpps-own-tools"
    assert slug("Held-out prompts in `specchat bench`") == "held-out-prompts-in-specchat-bench"
    assert slug("Serving, and the app on another machine") == "serving-and-the-app-on-another-machine"


def test_every_relative_link_lands() -> None:
    """A page split into README and docs/ is read by following links: one that leads nowhere is a dead
    end for exactly the reader the split was for."""
    assert len(PAGES) > 1, "docs/ holds the pages the README links to"
    broken = {page.relative_to(REPO).as_posix(): links for page in PAGES if (links := broken_links(page))}
    assert broken == {}


def indented_commands(text: str) -> list[str]:
    """The README's shell commands in order: each line of an indented code block."""
    return [line.strip() for line in text.splitlines() if line.startswith("    ") and line.strip()]


def ci_steps() -> list[str]:
    """What .ci/run runs of the project itself, step by step, in order."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    return [step for line in lines if line.startswith(("python3 ", ".venv/bin/")) for step in line.split(" && ")]


def test_the_readme_opens_with_what_ci_runs() -> None:
    """A newcomer copies the first two commands: the one that opens the app, then the test command,
    which must be what CI runs (.ci/run adds the lint between install and tests), so that a README
    that drifts from CI fails here rather than on the newcomer's machine."""
    launch, tests = indented_commands((REPO / "README.md").read_text())[:2]
    steps = tests.split(" && ")
    assert steps == [step for step in ci_steps() if not step.startswith(".venv/bin/ruff")]
    assert launch.split(" && ") == [steps[0], ".venv/bin/pip install -e .", ".venv/bin/specchat"]
