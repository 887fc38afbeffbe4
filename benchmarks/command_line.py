"""The command line every benchmark has: its docstring as the help, and its options."""

from __future__ import annotations

import argparse
from typing import Any


def options(doc: str | None, **flags: Any) -> argparse.Namespace:
    """Parse ``--name value`` for each of ``flags`` (``name=default`` or ``name=(default, help)``;
    ``some_name`` is ``--some-name``, a ``False`` default a switch) under ``doc``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, spec in flags.items():
        default, help_text = spec if isinstance(spec, tuple) else (spec, None)
        flag = "--" + name.replace("_", "-")
        if default is False:
            parser.add_argument(flag, action="store_true", help=help_text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=help_text)
    return parser.parse_args()
