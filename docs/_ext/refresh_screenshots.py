"""Copy the browser test's screenshots of the admin into the documentation.

    python -m pytest tests/browser              # writes artifacts/screenshots/*.png
    python docs/_ext/refresh_screenshots.py     # copies them to docs/images/admin/

The documentation shows committed copies, so that it builds without a browser; this
script refreshes them after a change to the admin, and says which pictures the pages use
that the browser test did not take (a renamed step), so none goes stale unnoticed.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
SOURCE = DOCS.parent / "artifacts" / "screenshots"
TARGET = DOCS / "images" / "admin"


def used_pictures() -> set[str]:
    """Return the file names of the admin pictures the pages show."""
    names: set[str] = set()
    for page in DOCS.rglob("*.md"):
        names.update(re.findall(r"images/admin/([\w.-]+\.png)", page.read_text()))
    return names


def main() -> int:
    taken = sorted(SOURCE.glob("*.png"))
    if not taken:
        sys.stderr.write(
            f"No screenshots in {SOURCE}: run python -m pytest tests/browser first "
            "(it needs Debian's chromium and chromium-driver).\n"
        )
        return 1
    TARGET.mkdir(parents=True, exist_ok=True)
    used = used_pictures()
    for picture in taken:
        if picture.name not in used:  # the pages show these only: the rest stay behind
            continue
        shutil.copyfile(picture, TARGET / picture.name)
        sys.stdout.write(f"copied {picture.name}\n")
    missing = sorted(used - {picture.name for picture in taken})
    if missing:
        sys.stderr.write(f"The pages show pictures the browser test no longer takes: {missing}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
