"""What a good report is: valid PNGs, and a page that loads offline with every plot."""

from __future__ import annotations

import re
from pathlib import Path

from chromium import load
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = ("history", "importances", "parallel_coordinate", "intermediate_values", "memory")


def assert_valid_png(path: Path) -> None:
    """A real picture: the signature, more than a blank canvas's bytes, a decodable image."""
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{path.name} is not a PNG"
    assert len(data) > 8_000, f"{path.name} is only {len(data)} bytes"
    with Image.open(path) as image:
        image.verify()
        assert image.size[0] > 300 and image.size[1] > 200


def assert_page_loads_offline(page: Path, n_trials: int, n_plots: int) -> None:
    """Chromium builds the table and every plot with no console message (CSP violations,
    missing files and script errors all land there)."""
    loaded = load(page)
    assert loaded.console == []
    assert len(re.findall(r"<tr class=", loaded.dom)) == n_trials
    images = re.findall(r'<img [^>]*src="([^"]{0,30})', loaded.dom)
    assert len(images) == n_plots and all(s.startswith("data:image/png;base64,") for s in images)
