"""The external test data scripts/fetch_test_data.py puts in build/test-data/ (llama.cpp's
tokenizer vectors, chat templates and converter from the llama-cpp-python sdist, DeepSeek's
tokenizer), and what a test does when it is not there.

A helper that needs it and does not find it raises ``MissingTestData``; tests/conftest.py
then stops the run at that test with one message naming the command, instead of failing
every test of the module alike (a targeted run without the data looked like breakage).
scripts/test.sh fetches the data before every run, so CI never sees this; nothing is
skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
TEST_DATA = ROOT / "build" / "test-data"
FETCH = "run `python scripts/fetch_test_data.py` (scripts/test.sh does) to fetch it"


class MissingTestData(FileNotFoundError):
    """Data from scripts/fetch_test_data.py is not there."""


def missing(what: str, where: Path) -> NoReturn:
    raise MissingTestData(f"{what} missing in {where}: {FETCH}")
