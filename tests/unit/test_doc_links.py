"""README.md stays a front page, and every relative link of README.md and docs/*.md lands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.readme import DOCS, README, REPO, anchors, github_anchor, lines_and_fences

pytestmark = pytest.mark.timeout(30)
README_MAX_BYTES = 20_000
INLINE_CODE = re.compile(r"`[^`]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: ...


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def link_targets(page: Path) -> list[str]:
    """Targets of the page's inline links and link definitions, outside code."""
    targets: list[str] = []
    for line, in_code in lines_and_fences(page):
        if in_code:
            continue
        prose = INLINE_CODE.sub("", line)
        targets += INLINE_LINK.findall(prose)
        targets += REFERENCE_DEFINITION.findall(prose)
    return targets


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """Each relative link of the page whose file (inside `root`) or `#heading` is missing."""
    broken: list[str] = []
    for target in link_targets(page):
        if SCHEME.match(target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(root) or not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading '#{fragment}' in {dest.relative_to(root)}")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_land(page: Path) -> None:
    assert not broken_links(page)


def test_readme_is_a_front_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move details into docs/"


def test_readme_links_every_docs_page() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for target in link_targets(README)
        if not SCHEME.match(target)
    }
    assert DOCS.is_dir()
    unlisted = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlisted, f"docs pages not linked from README.md: {unlisted}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "The `kubeddp` command line: manifests and clusters",
            "the-kubeddp-command-line-manifests-and-clusters",
        ),
        ("Ready-to-apply manifests (`k8s/`)", "ready-to-apply-manifests-k8s"),
        ("Settings (`checkpoint.*`)", "settings-checkpoint"),
        ("Training-loop overhead — goal met", "training-loop-overhead--goal-met"),
        ("kind (`e2e-kind.yml`, `tests/e2e/kind.sh`)", "kind-e2e-kindyml-testse2ekindsh"),
        ("`train_step` and [links](x.md)", "train_step-and-links"),
    ],
)
def test_github_anchor_rules(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (tmp_path / "outside.md").touch()
    (root / "other.md").write_text("# Other page\n\n## Part two\n")
    page = root / "page.md"
    page.write_text(
        "# Title\n\n[ok](other.md#part-two) [ok](#title) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [bad anchor](other.md#part-three) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n[out](../outside.md)\n"
    )
    assert broken_links(page, root=root) == [
        "missing.md: no such file",
        "other.md#part-three: no heading '#part-three' in other.md",
        "../outside.md: no such file",
    ]
