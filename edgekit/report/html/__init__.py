"""The HTML report: one self-contained file (inline CSS, plots as inline SVG, no scripts, no network), a view of
report.json for people. One concern a module:

- ``page``: :func:`render_html`, the page's sections in order (the entry point ``report/write.py`` calls);
- ``tables``: the variants, parity per output, gate checks, comparison, per-op profile and fleet tables;
- ``language_model``: a language model's race on the device and its quantization accounts;
- ``search``: the variant search's candidates and its timeline bar;
- ``lineage``: each distinct lineage once (settings of one file share it), its steps in columns;
- ``plots``: the matplotlib figures as inline SVG (``pip install 'edgekit[report]'``);
- ``markup``: the stylesheet, escaping, number formatting, records as key/value tables."""

from .page import render_html
from .plots import pareto_front, parity_hops, sustained_series

__all__ = ["render_html", "pareto_front", "parity_hops", "sustained_series"]
