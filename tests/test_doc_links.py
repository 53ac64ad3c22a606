"""Every relative link in the project's Markdown resolves, and every page the product card points users to
exists (the card once linked docs/guides/full-finetune.md while the page had another name)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "runs", "node_modules", ".pytest_cache"}
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s+<?(\S+?)>?\s*$", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
# pages and folders the published product card names (shared/spec/product-card.txt), user files left out
CARD_PATHS = (
    "README.md",
    "CLAUDE.md",
    "CONTRIBUTING.md",
    "CODE_OF_CONDUCT.md",
    "docs/README.md",
    "docs/concepts/profiles.md",
    "docs/guides/first-lora.md",
    "docs/guides/full-finetune.md",
    "docs/guides/inference.md",
    "docs/guides/install.md",
    "docs/guides/install-windows.md",
    "docs/guides/scripts.md",
    "docs/guides/weights.md",
    "docs/performance",
    "configs/moss/recipes",
    "scripts/examples/README.md",
)
CARD = REPO.parent / "shared" / "spec" / "product-card.txt"  # beside the checkout where it is laid out


def markdown_files() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.md") if not SKIP_DIRS.intersection(p.relative_to(REPO).parts))


def broken_links(page: Path) -> list[str]:
    """The relative link targets of `page` (inline and reference style, outside code blocks) that do not exist."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    out = []
    for target in INLINE.findall(text) + REFERENCE.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, mailto:, or an anchor in the same page
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            out.append(target)
    return out


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    assert not broken_links(page), f"{page.relative_to(REPO)}: links to missing files: {broken_links(page)}"


def test_the_checker_finds_a_dead_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text(
        "[ok](there.md#a) [dead](full-fine-tune.md) [web](https://example.org/x.md)\n"
        "```\n[in code](nowhere.md)\n```\n[ref]: gone/page.md\n"
    )
    assert broken_links(page) == ["full-fine-tune.md", "gone/page.md"]


@pytest.mark.parametrize("path", CARD_PATHS)
def test_pages_the_product_card_names_exist(path):
    assert (REPO / path).exists(), f"the product card points users to {path}, which does not exist"


def test_the_product_card_names_only_pages_that_exist():
    if not CARD.is_file():
        pytest.skip(f"{CARD} is not beside this checkout")
    named = set(
        re.findall(r"\b(?:docs|scripts|configs|assets)/[\w./-]*\w/?|\b[A-Z_]+\.md\b", CARD.read_text())
    )
    missing = sorted(p for p in named if not p.startswith("configs/user/") and not (REPO / p).exists())
    assert not missing, f"the product card names paths that do not exist: {missing}"
