"""The documentation keeps up with the code: the generated reference pages are current, every test a page
names exists, every algorithm page names one, and the README stays short with the commands CI runs.
(`mkdocs build --strict`, which needs the `docs` extra, runs in .ci/run.)"""

import ast
import glob
import importlib.util
import os
import re
import subprocess
import sys

from tests import REPO

DOCS = os.path.join(REPO, "docs")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::([\w:]+)")


def _generator():
    spec = importlib.util.spec_from_file_location("mmrl_docs_generate_reference",
                                                  os.path.join(DOCS, "generate_reference.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)         # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def _pages() -> list[str]:
    return sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)) + [
        os.path.join(REPO, "README.md"), os.path.join(REPO, "CONTRIBUTING.md")]


def test_generated_reference_pages_are_current():
    # a fresh interpreter: registrations made by other tests must not reach the page
    done = subprocess.run([sys.executable, os.path.join("docs", "generate_reference.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


SECTION = """
import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Section:
    rate: float = 0.5                 # how fast it goes
    # limits
    cap: Optional[int] = None         # the largest value;
                                      # None = no cap
    label: str = "a|b"
"""


def test_the_generator_documents_a_field_by_its_comment_and_groups(tmp_path):
    path = tmp_path / "mmrl_docs_demo_section.py"
    path.write_text(SECTION)
    spec = importlib.util.spec_from_file_location("mmrl_docs_demo_section", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        rows = _generator().section_table("demo", module.Section)
    finally:
        del sys.modules[spec.name]
    assert rows[2] == "| `demo.rate` | `float` | `0.5` | how fast it goes |"
    assert rows[3] == "| *limits* | | | |"
    assert rows[4] == "| `demo.cap` | `Optional[int]` | `null` | the largest value; None = no cap |"
    assert rows[5] == "| `demo.label` | `str` | `a\\|b` |  |"


def _test_names(path: str) -> set[str]:
    """`name` and `Class::name` of every function and method a test file defines."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{m.name}" for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def test_every_test_a_page_names_exists():
    missing, found = [], 0
    for page in _pages():
        text = open(page, encoding="utf-8").read()
        for path, name in TEST_REF.findall(text):
            found += 1
            full = os.path.join(REPO, path)
            if not os.path.isfile(full) or name not in _test_names(full):
                missing.append(f"{os.path.relpath(page, REPO)}: {path}::{name}")
    assert found > 0
    assert not missing, "pages name tests that do not exist:\n" + "\n".join(missing)


def test_every_algorithm_page_names_its_test():
    pages = [p for p in glob.glob(os.path.join(DOCS, "algorithms", "*.md")) if not p.endswith("index.md")]
    assert len(pages) >= 16
    without = [os.path.relpath(p, REPO) for p in pages if not TEST_REF.search(open(p, encoding="utf-8").read())]
    assert not without, f"algorithm pages that name no test (tests/...py::test_name): {without}"


def test_every_algorithm_page_is_in_the_nav_and_the_index():
    nav = open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8").read()
    index = open(os.path.join(DOCS, "algorithms", "index.md"), encoding="utf-8").read()
    for page in glob.glob(os.path.join(DOCS, "algorithms", "*.md")):
        name = os.path.basename(page)
        assert f"algorithms/{name}" in nav, name
        assert name == "index.md" or f"({name})" in index, name


def test_the_readme_is_short_and_has_the_commands_ci_runs():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert len(readme.encode()) <= 15 * 1024, f"README.md is {len(readme.encode())} bytes; move detail to docs/"
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    for command in ('pip install -e ".[test]"', "python -m pytest -q -n 2 --dist loadfile"):
        assert command in readme and command in ci, command
    assert "mmrl train configs/tiny/vlm_shapes.yaml" in readme
