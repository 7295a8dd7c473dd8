"""The docs are tested: hooks, plugins and CLI commands must be documented."""

import inspect
import re

import pytest

from cdcflow.core.cli.main import build_parser
from cdcflow.core.plugin import hookspec
from cdcflow.core.plugin.docs import page_name, plugin_page
from cdcflow.core.plugin.manager import PluginManager
from tests import REPO

DOCS = REPO / "docs"


def hook_names():
    return sorted(name for name, fn in inspect.getmembers(hookspec, inspect.isfunction) if name.startswith("cdcflow_"))


def test_there_are_hooks():
    assert len(hook_names()) >= 7


@pytest.mark.parametrize("name", hook_names())
def test_every_hook_is_documented(name):
    text = (DOCS / "reference" / "hooks.md").read_text()
    assert f"### {name}\n" in text, f"docs/reference/hooks.md has no section for {name}"
    fn = getattr(hookspec, name)
    for param in inspect.signature(fn).parameters:
        assert param in text.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0], (name, param)


@pytest.mark.parametrize("name", hook_names())
def test_every_hook_has_a_docstring(name):
    assert (getattr(hookspec, name).__doc__ or "").strip()


def test_plugin_reference_pages_are_current():
    pm = PluginManager.default(autoload=False)
    for registry in pm.registries().values():
        for entry in registry:
            page = DOCS / "reference" / "plugins" / page_name(entry)
            assert page.exists(), f"{page} is missing: run scripts/gen-plugin-docs"
            assert page.read_text() == plugin_page(entry), f"{page} is stale: run scripts/gen-plugin-docs"


def test_every_cli_command_is_documented():
    text = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in sub.choices:
        assert f"## cdcflow {name}\n" in text, name


def test_relative_links_resolve():
    for page in [*DOCS.rglob("*.md"), REPO / "README.md"]:
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).resolve().exists(), f"{page}: broken link {target}"


def _packages(root: str) -> list[str]:
    return sorted(str(p.parent.relative_to(REPO)) for p in (REPO / root).rglob("__init__.py"))


@pytest.mark.parametrize("package", _packages("core") + _packages("plugins"))
def test_the_architecture_page_lists_every_package(package):
    text = (DOCS / "explanation" / "architecture.md").read_text()
    assert f"| `{package}/` |" in text, f"docs/explanation/architecture.md: the layout table has no row for {package}/"


@pytest.mark.parametrize(
    ("name", "module"),
    re.findall(
        r"^\| [^|]+ \| `([A-Za-z]+)`[^|]* \| `((?:core|plugins)/[^`]+)` \|$",
        (DOCS / "explanation" / "architecture.md").read_text(),
        re.M,
    ),
)
def test_the_architecture_page_names_where_each_concept_lives(name, module):
    path = REPO / module
    sources = [path] if path.is_file() else sorted(path.rglob("*.py"))
    assert any(re.search(rf"^class {name}\b", src.read_text(), re.M) for src in sources), f"{name} is not in {module}"


def test_testing_fixtures_reference_is_current():
    from cdcflow.core.testing.fixture_docs import fixtures_page

    page = DOCS / "reference" / "testing-fixtures.md"
    assert page.exists(), f"{page} is missing: run scripts/gen-testing-docs"
    assert page.read_text() == fixtures_page(), f"{page} is stale: run scripts/gen-testing-docs"


def test_every_testing_fixture_is_documented():
    from cdcflow.core.testing import pytest_plugin

    for fixture in pytest_plugin.FIXTURES:
        assert len((fixture.__doc__ or "").strip()) > 80, f"{fixture.__name__}: its docstring is its reference"
