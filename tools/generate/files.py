"""Files the repository keeps generated (`make chart`, `make k8s`): write them, or with
`--check` print how the checked-in copies differ and fail (the tests run the check)."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path


def write_or_check(files: dict[Path, str], check: bool, remedy: str) -> int:
    """Write each changed file, or (check) print a diff of each stale one; exit code 1 when
    stale. `remedy` is the command that regenerates them, named in the one-line error."""
    stale = []
    for path, text in files.items():
        current = path.read_text() if path.is_file() else ""
        if current == text:
            continue
        if check:
            stale.append(str(path))
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    f"{path} (checked in)",
                    f"{path} (generated)",
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `{remedy}`", file=sys.stderr)
        return 1
    return 0
