"""The Sphinx extension that links every rule number of the site to its rule.

The guarantees page states each rule as a bullet that opens with its number in bold
(`- **S12** ...`). This extension gives each such bullet an anchor (`#s12`, a label `s12`
of the standard domain), and turns each rule number written in prose anywhere in the
site (`S12`, both ends of `S12-S15`, `(S10, S16)`, the docstrings autodoc renders) into a
link to it. Left as they are: code (blocks and inline), titles, signatures, text that
is a link already, and the bold number that opens a rule on the guarantees page. A link
whose whole text is one rule number and that points at the guarantees page
(`[S3](../explanation/guarantees.md#enqueue)`) is sent to the rule itself.

A number the guarantees page does not state (`S99`) is a warning, so a build with `-W`
fails instead of linking nowhere; so is a stated rule whose bullet got no anchor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from pgjobs_reference.rules import stated_rules
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: A rule number in prose: `S12`, not `S12x`, `XS12` or `S012`.
RULE_NUMBER = re.compile(r"\bS([1-9]\d*)\b")
_WHOLE_RULE = re.compile(r"^S([1-9]\d*)$")

#: Text inside these is never linked: code, titles (they go to tables of contents),
#: signatures, what is a link already, and what is not shown.
_UNLINKED = (
    nodes.FixedTextElement,  # code blocks, doctest blocks, math blocks, raw, comments
    nodes.literal,
    nodes.math,
    nodes.title,
    nodes.subtitle,
    nodes.reference,
    nodes.Invisible,
    addnodes.pending_xref,
    addnodes.desc_signature,
)


def rule_anchor(number: int) -> str:
    """Return the anchor (and label) of rule S<number> on the guarantees page: `s12`."""
    return f"s{number}"


def rule_link(number: int, text: str, docname: str) -> addnodes.pending_xref:
    """Return a reference to rule S<number> that reads `text`, resolved when the site is
    written (an anchor that went missing is then an "undefined label" warning)."""
    return addnodes.pending_xref(
        "",
        nodes.Text(text),
        refdomain="std",
        reftype="ref",
        reftarget=rule_anchor(number),
        refexplicit=True,
        refwarn=True,
        refdoc=docname,
    )


def rule_heading(item: nodes.list_item) -> tuple[int, nodes.strong] | None:
    """Return the number of the rule a bullet states and its bold opening, if it opens
    with one (`**S12** ...`)."""
    first = item.children[0] if item.children else None
    if not isinstance(first, nodes.paragraph):
        return None
    # MyST may open a paragraph with an empty text node.
    opening = next((child for child in first.children if child.astext().strip()), None)
    if not isinstance(opening, nodes.strong):
        return None
    match = _WHOLE_RULE.match(opening.astext())
    return (int(match.group(1)), opening) if match else None


class RuleLinks(SphinxTransform):
    """Anchor the rules on the guarantees page, and link rule numbers on every page."""

    # After the parsers' own transforms, before `doctree-read` (where the standard
    # domain collects the labels this adds).
    default_priority = 500

    def apply(self, **kwargs: Any) -> None:
        rules_page = self.config.pgjobs_rules_page
        stated = set(stated_rules(Path(self.env.doc2path(rules_page))))
        docname = self.env.docname
        headings: set[int] = set()
        if docname == rules_page:
            headings = self.anchor_rules(stated)
        for xref in list(self.document.findall(addnodes.pending_xref)):
            self.retarget(xref, rules_page, stated, docname)
        for text in list(self.document.findall(nodes.Text)):
            if not self.linkable(text, headings):
                continue
            pieces = self.link_numbers(text, stated, docname)
            if pieces:
                text.parent.replace(text, pieces)

    def anchor_rules(self, stated: set[int]) -> set[int]:
        """Give each rule's bullet its anchor; return the ids of their bold openings."""
        headings: set[int] = set()
        anchored: set[int] = set()
        for item in self.document.findall(nodes.list_item):
            found = rule_heading(item)
            if found is None or found[0] not in stated:
                continue
            number, opening = found
            item["names"].append(rule_anchor(number))
            self.document.note_explicit_target(item, item)
            headings.add(id(opening))
            anchored.add(number)
        for number in sorted(stated - anchored):
            logger.warning(
                "rule S%s has no bullet opening with **S%s** to anchor",
                number,
                number,
                location=self.document,
            )
        return headings

    def retarget(
        self, xref: addnodes.pending_xref, rules_page: str, stated: set[int], docname: str
    ) -> None:
        """Send a link that reads one rule number and points at the guarantees page to
        the rule's own anchor rather than the page or its section."""
        if xref.get("reftype") != "myst" or xref.get("reftarget") != rules_page:
            return
        match = _WHOLE_RULE.match(xref.astext())
        if match and int(match.group(1)) in stated:
            xref.replace_self(rule_link(int(match.group(1)), xref.astext(), docname))

    @staticmethod
    def linkable(text: nodes.Text, headings: set[int]) -> bool:
        """Whether rule numbers in this text become links (see _UNLINKED)."""
        parent = text.parent
        while parent is not None:
            if isinstance(parent, _UNLINKED) or id(parent) in headings:
                return False
            parent = parent.parent
        return True

    def link_numbers(self, text: nodes.Text, stated: set[int], docname: str) -> list[nodes.Node]:
        """Return the text cut into plain pieces and links, or [] when nothing links."""
        source = str(text)
        pieces: list[nodes.Node] = []
        done = 0
        for match in RULE_NUMBER.finditer(source):
            number = int(match.group(1))
            if number not in stated:
                logger.warning(
                    "%s is not a rule the guarantees page states",
                    match.group(0),
                    location=text.parent,
                )
                continue
            if match.start() > done:
                pieces.append(nodes.Text(source[done : match.start()]))
            pieces.append(rule_link(number, match.group(0), docname))
            done = match.end()
        if not pieces:
            return []
        if done < len(source):
            pieces.append(nodes.Text(source[done:]))
        return pieces


def setup(app: Sphinx) -> dict[str, Any]:
    # The docname of the page that states the rules.
    app.add_config_value("pgjobs_rules_page", "explanation/guarantees", "env", types=[str])
    app.add_transform(RuleLinks)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
