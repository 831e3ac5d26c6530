"""The phases of ``make test`` (tests/conftest.py): every test runs in exactly one of them, and
the single tests moved to the serial phase exist under the names given."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import conftest

TESTS = Path(__file__).parent


def functions_of(module: str) -> set[str]:
    tree = ast.parse((TESTS / f"{module}.py").read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    }


def test_every_single_serial_test_is_a_test_of_its_module() -> None:
    missing = {
        (module, name) for module, name in conftest.SERIAL_TESTS if name not in functions_of(module)
    }
    assert not missing, f"SERIAL_TESTS names no such test: {sorted(missing)}"


def test_every_module_of_a_later_phase_is_a_file_the_phase_is_given() -> None:
    serial = set(conftest.phase_paths("serial"))
    modules = conftest.SERIAL_MODULES | {m for m, _ in conftest.SERIAL_TESTS}
    assert serial == {f"tests/{m}.py" for m in modules}
    assert set(conftest.phase_paths("solo")) == {f"tests/{m}.py" for m in conftest.SOLO_MODULES}
    for path in serial | set(conftest.phase_paths("solo")):
        assert (TESTS.parent / path).is_file(), path


def test_the_serial_and_solo_modules_are_apart() -> None:
    assert not conftest.SERIAL_MODULES & conftest.SOLO_MODULES
    assert not {m for m, _ in conftest.SERIAL_TESTS} & conftest.SOLO_MODULES
