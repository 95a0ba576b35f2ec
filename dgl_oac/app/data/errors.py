"""Dataset errors. Both carry the path that was looked at, what was expected there and how to obtain it."""
from __future__ import annotations


class DatasetNotFoundError(FileNotFoundError):
    """The dataset folder or one of its required files does not exist."""


class DatasetFormatError(ValueError):
    """A dataset file exists but cannot be parsed (truncated, wrong columns, wrong pickle content, ...)."""
