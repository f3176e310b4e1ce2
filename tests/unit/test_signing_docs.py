"""docs/signing.md's table of attacks names, for each row, the test that shows it.

The table is what a security review reads: what an attacker without a key can and
cannot make redrive do. Each row names a test by file and function; this keeps the
names true (a test renamed or removed fails here), and the tests keep the rows true.
The App example of the page's "Signing an App" section is run too: each App it makes
has the setting it says.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from redrive import App, RefuseAndCount, RefuseToDeadLetters

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "signing.md"
SECTION = "## What an attacker without a key can and cannot do"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def rows() -> list[str]:
    section = PAGE.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]


def test_every_row_of_the_attack_table_names_a_test_that_exists() -> None:
    body = rows()[1:]  # after the heading row
    assert len(body) >= 15
    for row in body:
        named = NAMED.findall(row)
        assert named, f"names no test: {row[:80]}"
        for path, name in named:
            tree = ast.parse((ROOT / path).read_text())
            functions = {
                node.name
                for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert name in functions, f"{path} has no {name}"


def test_the_pages_app_example_makes_the_apps_it_says(tmp_path: Path) -> None:
    page = PAGE.read_text().split("\n## Signing an App\n", 1)[1].split("\n## ", 1)[0]
    block = page.split("```python\n")[2].split("```", 1)[0]
    keys = tmp_path / "signing-keys"
    keys.write_text("k1=" + "A" * 43 + "=\n")
    namespace: dict[str, object] = {}
    exec(block.replace("/etc/redrive/signing-keys", str(keys)), namespace)
    apps = {name: v for name, v in namespace.items() if isinstance(v, App)}
    assert set(apps) == {"app", "counted", "rolling"}
    assert apps["app"].settings.returns == RefuseToDeadLetters()
    assert apps["counted"].settings.returns == RefuseAndCount()
    assert apps["rolling"].settings.returns == RefuseToDeadLetters(trust_unsigned=True)
    assert all(a.settings.signing is not None for a in apps.values())
