"""mkdocs hooks (mkdocs.yml: ``hooks:``): add the generated reference pages (the CLI and the schemas) to the
site at every build, so they are never committed and never stale. See ``reference.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config):
    # mkdocs restores sys.path after loading a hook module, so the repository root goes on it here
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from docs._gen.reference import cli_page, schema_pages

    pages = {"reference/cli.md": cli_page(), **schema_pages()}
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
