"""What a notebook brings to a page of the book is sanitized; what the book itself writes is not.

A chapter's Markdown (after nbconvert turns it into HTML), its raw cells and its ``text/html`` and
``text/markdown`` outputs go through :func:`clean`: bleach (already a dependency of nbconvert) with
an allow-list of exactly what the chapters use, and everything else escaped so a reader sees it as
text. What the chapters use, and why each needs raw HTML:

- everything Markdown itself produces (headings with their anchor links, paragraphs, lists, tables
  with their column alignment, code blocks highlighted by pygments, emphasis, links, images);
- ``<details><summary>`` in Markdown: every chapter's exercises hide their answers this way;
- ``<b>``, ``<br>`` and ``<span style="color:…">`` in outputs: the context-parallel summary
  (:func:`playbook.viz.cp_dashboard.cp_summary`) is HTML with a coloured verdict.

No script, event handler, ``style`` element, form, frame or ``javascript:`` link survives; CSS in a
``style`` attribute keeps only colour, weight and alignment. The book's own HTML (figure ``<div>``s
with their JSON, the note that replaces a live dashboard) is made by :mod:`playbook.book.render`
after this and passes unchanged, because the page script must read it.
"""

from __future__ import annotations

import bleach
from bleach.css_sanitizer import CSSSanitizer

TAGS = frozenset(
    {"a", "abbr", "b", "blockquote", "br", "code", "del", "details", "div", "em", "h1", "h2", "h3", "h4", "h5"}
    | {"h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "summary", "sup"}
    | {"table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul"}
)
ATTRIBUTES = {
    "*": ["class", "id", "title"],
    "a": ["href", "rel"],
    "img": ["src", "alt", "width", "height"],
    "ol": ["start"],
    "details": ["open"],
    "th": ["style", "colspan", "rowspan", "align"],
    "td": ["style", "colspan", "rowspan", "align"],
    "span": ["style"],
}
PROTOCOLS = frozenset({"http", "https", "mailto"})  # relative links (#anchor, x.html) pass too
CSS = CSSSanitizer(allowed_css_properties=frozenset({"color", "background-color", "font-weight", "text-align"}))
_CLEANER = bleach.Cleaner(
    tags=TAGS, attributes=ATTRIBUTES, protocols=PROTOCOLS, css_sanitizer=CSS, strip=False, strip_comments=True
)


def clean(text) -> str:
    """``text`` (HTML from a notebook) with only the allowed tags, attributes and CSS left as markup."""
    text = "".join(text) if isinstance(text, list) else str(text)
    return _CLEANER.clean(text)


__all__ = ["ATTRIBUTES", "TAGS", "clean"]
