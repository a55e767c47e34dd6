"""Where the project's files are: the checkout's root (README.md, docs/) and its stored results."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
