"""Guards that any test file can be collected alone or together with any other folder.

pytest imports test modules and folder helpers by basename (the folders have no __init__.py),
so two files of one basename, or a `from conftest import ...` (several folders have a
conftest.py), work in one folder and break when folders are collected together."""

import ast
import collections
import os

from testkit import REPO

TESTS = os.path.join(REPO, "tests")


def _python_files() -> list[str]:
    found = []
    for dirpath, _, names in os.walk(TESTS):
        found += [os.path.join(dirpath, n) for n in names if n.endswith(".py")]
    return found


def _imported_modules(path: str) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
    return names


def test_no_test_imports_conftest():
    offenders = [os.path.relpath(p, REPO) for p in _python_files() if "conftest" in _imported_modules(p)]
    assert not offenders, f"import helpers from testkit (or a uniquely named helper module), not conftest: {offenders}"


def test_module_basenames_are_unique_outside_conftest():
    by_name = collections.defaultdict(list)
    for p in _python_files():
        if os.path.basename(p) != "conftest.py":
            by_name[os.path.basename(p)].append(os.path.relpath(p, REPO))
    clashes = {n: ps for n, ps in by_name.items() if len(ps) > 1}
    assert not clashes, f"test modules and helpers are imported by basename; rename one of each: {clashes}"
