"""mkdocs hook: the package's docstrings use Sphinx roles (``:class:`~dgl_oac.X```), which Markdown renders as
``:class:`` followed by code. Turn each into a cross-reference that mkdocs-autorefs resolves when the target
has a reference entry (``optional``: plain code, no warning, when it has none); ``~`` keeps the last name."""
from __future__ import annotations

import html
import re

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")


def _ref(match: re.Match) -> str:
    short, target = match.group(1), html.unescape(match.group(2)).strip()
    title = target.rsplit(".", 1)[-1] if short else target
    if not target.startswith("dgl_oac"):
        return f"<code>{html.escape(title)}</code>"
    return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(title)}</code></autoref>'


def on_page_content(content: str, page, config, files) -> str:
    return ROLE.sub(_ref, content)
