"""Keeping third-party chatter (converter progress lines, warnings) out of edgekit's output."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Iterator


@contextlib.contextmanager
def quiet(*logger_names: str) -> Iterator[io.StringIO]:
    """Silence warnings, stdout and the named loggers; yields what was printed (for error messages)."""
    buf = io.StringIO()
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in logger_names]
    for lg, _ in saved:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
            warnings.simplefilter("ignore")
            yield buf
    finally:
        for lg, lvl in saved:
            lg.setLevel(lvl)
