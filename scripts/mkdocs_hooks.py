"""MkDocs hook: the Sphinx roles in docstrings (``:class:`~a.B```) read as plain code on the site.

mkdocstrings renders Google-style docstrings but leaves Sphinx roles as text; the role is
dropped and a leading ``~`` keeps only the last dotted part, as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub(lambda m: f"<code>{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}</code>", html)
