"""The one exception type for data problems a user can fix (bad path, empty folder, corrupt file)."""

from __future__ import annotations


class DataError(ValueError):
    """A data source is missing, empty or unreadable; the message names the path or the option."""
