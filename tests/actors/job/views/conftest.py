"""A real headless browser for the HTML report's tests: Debian's chromium, taking a
screenshot of a page, and a count of the pixels of a colour in it (Pillow).

Without chromium (or Pillow) the browser tests skip, and fail when ``CI`` is set
(``.ci/run`` installs chromium when it is missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSER_TIMEOUT_S = 120.0
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
)  # fmt: skip


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _require(condition: bool, reason: str) -> None:
    """Skip when ``condition`` is false; fail instead when ``CI`` is set."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


class Browser:
    """Debian's chromium, headless: :meth:`screenshot` renders a file to a PNG."""

    def __init__(self, executable: str, scratch: Path) -> None:
        self.executable = executable
        self.scratch = scratch

    def screenshot(self, page: Path, png: Path, *, width: int = 1200, height: int = 900) -> Path:
        """Render ``page`` (a local file) at ``width`` x ``height`` into ``png``."""
        profile = self.scratch / f"profile-{png.stem}"
        profile.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                f"--window-size={width},{height}", page.resolve().as_uri(),
            ],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S,
        )  # fmt: skip
        made = png.is_file() and png.stat().st_size > 0
        assert made, f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
        return png

    @staticmethod
    def pixels_of(png: Path, color: str, tolerance: int = 24) -> int:
        """Pixels of ``png`` within ``tolerance`` (per channel) of ``color`` (``#rrggbb``)."""
        from PIL import Image

        want = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
        with Image.open(png) as image:
            colors = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
        return sum(
            n for n, px in colors if all(abs(a - b) <= tolerance for a, b in zip(px, want, strict=True))
        )


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory) -> Browser:
    """A :class:`Browser`; skipped without chromium or Pillow (failed when ``CI`` is set)."""
    executable = _find_chromium()
    _require(executable is not None, "chromium is missing (apt-get install -y chromium)")
    try:
        import PIL  # noqa: F401
    except ImportError:
        _require(False, "Pillow is missing (pip install tooldispatch[test])")
    assert executable is not None
    return Browser(executable, tmp_path_factory.mktemp("browser"))
