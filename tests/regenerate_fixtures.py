"""Rewrite the conversion fixtures' golden files from what the gateway writes now: the tree of
tests/fixtures/conversion and that of bedrock channels' protocols, tests/fixtures/bedrock
(whose streams also keep the usage read, ``usage.json``).

    python -m tests.regenerate_fixtures [--check] [PAIR_OR_CASE ...]      (make fixtures)

A case's ``case.json`` and the requests and replies it names (tests/fixtures/README.md) are
the inputs and are never touched; the case's ``upstream_request.json`` and
``client_response.{json,sse}`` or ``client_error.json`` are written (JSON normalized: sorted
keys, two-space indents; ids and times are the fixed ones of the test ``Ctx``: ``req-test``,
1700000000), and a golden file of another shape left from before is removed. A second run
changes nothing. The diff is for review: a changed golden file is a changed behaviour.
``--check`` writes nothing and exits 1 when a file would change. Arguments narrow the run to
cases whose ``<pair>/<case>`` path contains one of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from tests import test_bedrock_conversion, test_conversion

GOLDEN = (
    "upstream_request.json",
    "client_response.json",
    "client_response.sse",
    "client_error.json",
    "usage.json",
)
TREES = (test_conversion, test_bedrock_conversion)  # tests/fixtures/conversion, .../bedrock


def main(argv: list[str]) -> int:
    check = "--check" in argv
    wanted = [a for a in argv if a != "--check"]
    changed = 0
    for tree in TREES:
        changed += _regenerate(tree.ROOT, tree.case_dirs(), tree.outputs, wanted, check)
    print(f"{changed} file(s) {'would change' if check else 'written'}")
    return 1 if check and changed else 0


def _regenerate(
    root: Path,
    paths: list[Path],
    outputs: Callable[[Path], dict[str, bytes]],
    wanted: list[str],
    check: bool,
) -> int:
    changed = 0
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if wanted and not any(w in rel for w in wanted):
            continue
        files = outputs(path)
        for name in GOLDEN:
            target = path / name
            data = files.get(name)
            if data is None:
                if target.exists():
                    changed += 1
                    print(f"removed {rel}/{name}")
                    if not check:
                        target.unlink()
            elif not target.exists() or target.read_bytes() != data:
                changed += 1
                print(f"{'new' if not target.exists() else 'changed'} {rel}/{name}")
                if not check:
                    target.write_bytes(data)
    return changed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
