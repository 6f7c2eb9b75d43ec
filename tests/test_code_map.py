"""docs/architecture.md's code map names every module of every installed package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "capture", "lowlevel", "highlevel", "queries", "tools")


def _sections() -> dict[str, str]:
    """The code map's text under each package's heading (### `pkg/`: ...)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    code_map = text.split("## Code map", 1)[1]
    parts = re.split(r"^### `([a-z_]+)/`", code_map, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_code_map_names_every_module(package):
    section = _sections().get(package)
    assert section is not None, f"docs/architecture.md's code map has no section for {package}/"
    root = REPO / package
    missing = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py" or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root)
        # a module in a subfolder is named under its folder's entry: `folder/` then `name.py`
        if path.name not in section or (len(rel.parts) > 1 and f"{rel.parts[0]}/" not in section):
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md's code map for {package}/ does not name: {', '.join(missing)}"
