"""Debian's Chromium for the console tests (the `chromium` fixture is in tests/e2e/conftest.py)
and the camera that photographs each page: under the test's tmp dir, and the latest set in
/tmp/helpers/console-shots/ for a person to look at."""

from __future__ import annotations

import shutil
from pathlib import Path

from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
LATEST_SHOTS = Path("/tmp/helpers/console-shots")


class Camera:
    def __init__(self, page: Page, folder: Path, first: int = 1) -> None:
        self.page = page
        self.folder = folder
        self.first = first
        self.taken: list[Path] = []

    def shoot(self, name: str) -> None:
        path = self.folder / f"{self.first + len(self.taken):02d}-{name}.png"
        self.page.screenshot(path=path, full_page=True)
        self.taken.append(path)

    def publish(self) -> None:
        LATEST_SHOTS.mkdir(parents=True, exist_ok=True)
        for old in LATEST_SHOTS.glob(f"{self.first // 10}?-*.png"):
            old.unlink()
        for path in self.taken:
            shutil.copy(path, LATEST_SHOTS / path.name)
