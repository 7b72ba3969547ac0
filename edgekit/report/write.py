"""Write a report's four files: every view is rendered before the folder is touched (a rendering bug
cannot leave a mix of old and new files), then each file is written atomically, ``report.json`` last:
its presence marks a complete set.

The views are looked up on their modules at call time (``html.render_html``...), so this module is the
only place that joins the schema (model.py) to its views; ``Report.write`` calls :func:`write_report`
(handed over to model.py by ``provides``: the schema imports no view).
"""

from __future__ import annotations

from pathlib import Path

from ..fsutil import atomic_write_text
from . import html, junit, markdown
from .model import Report, provides

FILES = {"md": "report.md", "html": "report.html", "junit": "junit.xml", "json": "report.json"}


def render_all(report: Report) -> dict[str, str]:
    """The text of every file, by key (md, html, junit, json)."""
    return {
        "md": markdown.render_markdown(report),
        "html": html.render_html(report),
        "junit": junit.render_junit(report),
        "json": report.to_json(),
    }


@provides  # Report.write
def write_report(report: Report, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, report.html, junit.xml and report.json into ``out_dir``; returns their paths by key."""
    out = Path(out_dir)
    paths = {key: out / name for key, name in FILES.items()}
    texts = render_all(report)  # everything first: nothing is written when one view fails
    for key in ("md", "html", "junit", "json"):  # report.json last
        atomic_write_text(paths[key], texts[key])
    return paths
