"""The layering of the packages, as import-linter contracts (pyproject.toml, [tool.importlinter]): rewards and envs
at the bottom, the core above them, the adapters on top and independent of each other, the shapes world's
generators on rewards alone, and no import cycle among the core's modules. Imports inside functions count."""

import os

from importlinter.cli import lint_imports


def _lint(repo: str, config: str) -> int:
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        return lint_imports(config_filename=config, no_cache=True)
    finally:
        os.chdir(cwd)


def test_the_layering_contracts_hold(repo_root):
    assert _lint(repo_root, os.path.join(repo_root, "pyproject.toml")) == 0


def test_a_broken_contract_is_reported(tmp_path, repo_root):
    """The contracts see real imports: the adapters do import the core, so forbidding it fails."""
    config = tmp_path / "contracts.ini"
    config.write_text("[importlinter]\nroot_packages =\n    mmrl\n    vlm\n\n"
                      "[importlinter:contract:up]\nname = vlm without the core\ntype = forbidden\n"
                      "source_modules =\n    vlm\nforbidden_modules =\n    mmrl\n")
    assert _lint(repo_root, str(config)) == 1
