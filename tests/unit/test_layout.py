"""Layout rules from STYLE.md that a refactor could silently break."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_standard_library_operator_is_not_shadowed_from_the_repo_root() -> None:
    # `python -c` puts the working directory first on sys.path, as a shell in
    # the repo root would.
    probe = ("import operator, collections, sysconfig; "
             "print(operator.__file__); print(sysconfig.get_paths()['stdlib'])")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                            text=True, check=True)
    module_file, stdlib = result.stdout.split()
    assert Path(module_file).resolve().is_relative_to(Path(stdlib).resolve())
    assert not (REPO / "operator" / "__init__.py").exists()
    assert not (REPO / "cells" / "__init__.py").exists()


def test_no_loose_modules_beside_the_packages() -> None:
    # An editable install puts operator/ and cells/ on sys.path.
    for folder in ("operator", "cells"):
        assert not list((REPO / folder).glob("*.py")), f"loose module in {folder}/"


def test_tests_are_not_a_package() -> None:
    assert not list((REPO / "tests").rglob("__init__.py"))


def test_domain_core_imports_no_adapters() -> None:
    """A second guard beside import-linter: the pure core names none of the I/O libraries."""
    forbidden = ("kopf", "kubernetes", "aetcd", "psycopg", "fastapi", "httpx", "grpc", "uvicorn")
    for module in (REPO / "operator" / "cellplane_operator" / "domain").rglob("*.py"):
        for line in module.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                root = words[1].split(".")[0]
                assert root not in forbidden, f"{module.name} imports {root}"
