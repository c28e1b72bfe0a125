"""Guards that any test file can be collected alone or together with any other folder.

tests/ is a package and so is each folder in it: pytest imports a test module as
`tests.<folder>.<module>`, so two files of one basename never clash and a folder never shadows the
package it tests (`tests/rewards` and `rewards`). Only pytest imports the test tree: a helper shared by
tests is a fixture (tests/conftest.py, or its folder's conftest.py), never a module a test imports by
name (`import helpers` would work only where pytest happened to put that folder on sys.path), and
the one thing taken from the tree by import is a constant of tests/__init__.py (`from tests import
REPO, BANDIT`) that module-level code needs before any fixture runs. A file that a config or a
subprocess loads by path (tests/vlm/agent_env.py) stays standalone."""

import ast
import os

from tests import REPO

TESTS = os.path.join(REPO, "tests")
RETIRED = {"testkit", "helpers", "diffusion_helpers", "reward_server_kit", "chat_server"}   # modules fixtures replaced


def _folders() -> list[str]:
    found = []
    for dirpath, dirnames, _ in os.walk(TESTS):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        found.append(dirpath)
    return found


def _python_files() -> list[str]:
    return [os.path.join(d, n) for d in _folders() for n in sorted(os.listdir(d)) if n.endswith(".py")]


def _imports(path: str) -> list[tuple[str, list[str], int]]:
    """(module, imported names, level) of every import in `path`, those inside functions included:
    `import a.b` is ("a.b", [], 0), `from a import b, c` ("a", ["b", "c"], 0), `from . import b` ("", ["b"], 1)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", [a.name for a in node.names], node.level))
    return found


def _constants() -> set[str]:
    """The names tests/__init__.py assigns at module level (REPO, BANDIT)."""
    tree = ast.parse(open(os.path.join(TESTS, "__init__.py"), encoding="utf-8").read())
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}


def _is_project_package(name: str) -> bool:
    """A top-level module of the project (mmrl, vlm, rewards, ...): a test folder of that name is no import of it."""
    return os.path.isfile(os.path.join(REPO, name + ".py")) or os.path.isfile(os.path.join(REPO, name, "__init__.py"))


def _where(path: str, module: str, names: list[str], level: int) -> str:
    return f"{os.path.relpath(path, REPO)}: {'.' * level}{module}" + (f" import {', '.join(names)}" if names else "")


def test_every_test_folder_is_a_package_and_nothing_imports_conftest():
    not_packages = [os.path.relpath(d, REPO) for d in _folders()
                    if any(n.endswith(".py") for n in os.listdir(d))
                    and not os.path.isfile(os.path.join(d, "__init__.py"))]
    assert not not_packages, ("folders of tests/ with .py files and no __init__.py "
                              f"(pytest imports tests.<folder>.<module>): {not_packages}")
    offenders = [_where(p, module, names, level) for p in _python_files()
                 for module, names, level in _imports(p)
                 if "conftest" in module.split(".") or "conftest" in names]
    assert not offenders, f"take a conftest helper as a fixture argument, never import conftest: {offenders}"


def test_nothing_imports_the_test_tree_by_module_name():
    tree_names = {n[:-3] if n.endswith(".py") else n for d in _folders() for n in os.listdir(d)
                  if (n.endswith(".py") or os.path.isdir(os.path.join(d, n)))
                  and n not in ("__pycache__", "__init__.py")}
    bare = {n for n in tree_names if not _is_project_package(n)} | RETIRED     # agent_env, conftest, ...
    constants = _constants()
    offenders = []
    for p in _python_files():
        for module, names, level in _imports(p):
            top = module.split(".")[0]
            if level > 0:
                bad = True                                              # from . import x, from .helpers import y
            elif top == "tests":
                bad = module != "tests" or not names or not set(names) <= constants     # from tests import REPO
            else:
                bad = top in bare
            if bad:
                offenders.append(_where(p, module, names, level))
    assert not offenders, ("helpers of the test tree are fixtures (tests/conftest.py or a folder's conftest.py), "
                           f"constants come from `from tests import {', '.join(sorted(constants))}`; "
                           f"these import test-tree modules by name: {offenders}")
