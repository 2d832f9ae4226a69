"""The user docs hold together: every relative link resolves, and docs/options.md lists exactly
the options and ini keys the plugin registers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_distperf import config

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "benchmarks").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])(--(?:distperf[\w-]*|gpus))\b")
INI = re.compile(r"\b(distperf_[a-z_]+)\b")


def relative_links(page: Path) -> list[str]:
    """Links to files of the repository (not URLs, not anchors within the page)."""
    targets = LINK.findall(page.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [t for t in relative_links(page)
              if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#x) [web](https://pytorch.org) [a](#top)")
    assert relative_links(page) == ["page.md", "missing.md#x"]


def test_options_page_matches_the_plugin(pytester: pytest.Pytester) -> None:
    """The flags and ini keys in ``pytest --help`` are the ones docs/options.md lists."""
    result = pytester.runpytest("--help")
    text = "\n".join(result.outlines)
    flags, inis = set(FLAG.findall(text)), set(INI.findall(text))
    page = (ROOT / "docs" / "options.md").read_text()
    assert flags and inis, "the plugin registered no options: is it installed?"
    assert flags == set(FLAG.findall(page)), (flags ^ set(FLAG.findall(page)))
    assert inis == set(INI.findall(page)), (inis ^ set(INI.findall(page)))



def test_every_help_text_is_one_line() -> None:
    """Each option's help is one short line in ``pytest --help``; docs/options.md says more."""
    texts = {k: v for k, v in vars(config).items() if k.startswith("HELP_")}
    assert len(texts) >= 17 and all(len(v) <= 80 and "\n" not in v for v in texts.values()), {
        k: len(v) for k, v in texts.items() if len(v) > 80}


CODE_NAME = re.compile(r"`([a-z]+)\.([A-Za-z_][\w.]*)`")


def test_every_name_the_verdict_rule_cites_is_in_the_code() -> None:
    """docs/verdict-rule.md names the code of each sentence as `module.name`, a module of
    pytest_distperf/verdict/: each such name exists there."""
    import importlib

    text = (ROOT / "docs" / "verdict-rule.md").read_text()
    modules = {p.stem for p in (ROOT / "pytest_distperf" / "verdict").glob("*.py")}
    cited = [(m, name) for m, name in CODE_NAME.findall(text)
             if m in modules and name != "py"]  # `explain.py` is a file
    assert len(cited) >= 40, cited  # the sentences cite their code
    missing = []
    for module, name in cited:
        obj: object = importlib.import_module(f"pytest_distperf.verdict.{module}")
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(f"{module}.{name}")
                break
            obj = getattr(obj, part)
    assert not missing, f"docs/verdict-rule.md cites names the code does not have: {missing}"
