"""The error an adapter raises when its framework is not installed."""

from __future__ import annotations


def missing_framework(extra: str, error: ImportError, where: str = "") -> ImportError:
    """One line naming the missing module and the hgpo extra that installs it (``where``: a
    note on where to install it)."""
    return ImportError(f"this integration needs {error.name or error}: pip install -e '.[{extra}]'{where}")
