"""A small HTML tree for tests of the HTML report (stdlib html.parser): find elements by tag and class or id,
read a table's header and its own rows' cells without the tables nested inside them."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source", "track"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self, tag: str | None = None, cls: str | None = None, id: str | None = None):
        for c in self.children:
            if isinstance(c, Node):
                if (tag is None or c.tag == tag) and (cls is None or cls in c.attrs.get("class", "").split()) \
                        and (id is None or c.attrs.get("id") == id):
                    yield c
                yield from c.iter(tag, cls, id)

    def own(self, tag: str) -> list[Node]:
        """Descendants with ``tag`` that are not inside another ``tag`` below this node (a table's own rows)."""
        out: list[Node] = []
        for c in self.children:
            if isinstance(c, Node):
                if c.tag == tag:
                    out.append(c)
                elif c.tag != "table":
                    out += c.own(tag)
        return out

    def rows(self) -> list[list[Node]]:
        """This table's own rows (thead and tbody), each its own cells."""
        return [[c for c in tr.children if isinstance(c, Node) and c.tag in ("td", "th")] for tr in self.own("tr")]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    b = _Builder()
    b.feed(html)
    b.close()
    return b.root
