"""`--help` reads like a well-kept Typer CLI: options grouped in named panels, and prose that wraps at the
terminal's width, not where the source's lines happen to break."""

from __future__ import annotations

import re

import pytest

WIDTHS = (80, 140)
BOX = "│╭╰╮╯─┃┏┗┓┛━"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
DEPLOY_PANELS = ("Model and data", "Language models", "Target and device", "Variants and search", "Gate",
                 "Release gate (vs --baseline)", "Measurement", "Fleet and lab", "Host", "Output")


def _root():
    import typer.main

    from edgekit.cli.main import app

    return typer.main.get_command(app)


def _commands(group=None, path=()):
    """(path, click command) of every command below the root, groups included."""
    group = group if group is not None else _root()
    for name, cmd in getattr(group, "commands", {}).items():
        yield path + (name,), cmd
        yield from _commands(cmd, path + (name,))


def _options(cmd):
    return [p for p in cmd.params if p.param_type_name == "option"]


def _panel(param):
    return getattr(param, "rich_help_panel", None)


@pytest.fixture
def render(monkeypatch):
    """`edgekit ARGS` as a terminal of `width` columns shows it (colour off, width pinned even when the
    environment sets TERMINAL_WIDTH)."""
    import typer.rich_utils
    from typer.testing import CliRunner

    from edgekit.cli.main import app

    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False, raising=False)

    def run(args, width: int) -> list[str]:
        monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width, raising=False)
        r = CliRunner().invoke(app, list(args), env={"COLUMNS": str(width), "TERMINAL_WIDTH": None,
                                                     "FORCE_COLOR": None, "NO_COLOR": "1"})
        assert r.exit_code == 0, r.output
        lines = ANSI.sub("", r.output).splitlines()
        assert max(len(x) for x in lines) <= width, "the help is wider than the terminal"
        return lines

    return run


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _plain(markup: str) -> str:
    from rich.text import Text

    return Text.from_markup(markup).plain


def _literal(help_text: str) -> str:
    """What the help should show: its text, escaped brackets unescaped (no other markup is meant)."""
    return help_text.replace("\\[", "[")


def _premature_breaks(lines: list[str], avail: int) -> list[str]:
    """Breaks where the next line's first word would still have fitted: a hard newline, not wrapping."""
    bad = []
    for cur, nxt in zip(lines, lines[1:]):
        word = nxt.split()[0] if nxt.split() else ""
        if word and len(cur.rstrip()) + 1 + len(word) < avail:
            bad.append(f"{cur.rstrip()!r} / {word!r}")
    return bad


# --- (a) panels ---------------------------------------------------------------------------------------------


def test_every_deploy_option_is_in_a_named_panel(render):
    from edgekit.cli import common

    deploy = _root().commands["deploy"]
    loose = [p.opts[0] for p in _options(deploy) if not _panel(p)]
    assert loose == [], f"deploy options outside a named panel: {loose}"
    assert {_panel(p) for p in _options(deploy)} == set(DEPLOY_PANELS)
    assert set(DEPLOY_PANELS) <= {v for k, v in vars(common).items() if k.startswith("PANEL_")}
    out = "\n".join(render(["deploy", "--help"], 140))
    for title in DEPLOY_PANELS:
        assert re.search(rf"╭─ {re.escape(title)} ─", out), f"no {title!r} panel in deploy --help"
    # the default "Options" panel holds --help alone
    default = out.split("╭─ Options ─", 1)[1].split("╰", 1)[0]
    assert re.findall(r"--[\w-]+", default) == ["--help"], default


def test_commands_with_many_options_group_all_of_them():
    """More than 8 options: every one in a named panel. Fewer: none (one panel of a few is not split)."""
    from edgekit.cli import common

    panels = {v for k, v in vars(common).items() if k.startswith("PANEL_")}
    for path, cmd in _commands():
        opts = _options(cmd)
        named = [p for p in opts if _panel(p)]
        name = " ".join(path)
        if len(opts) > 8:
            assert len(named) == len(opts), f"edgekit {name}: {[p.opts[0] for p in opts if not _panel(p)]} " \
                                            f"outside a named panel"
        assert not named or len(named) == len(opts), f"edgekit {name} groups only some of its options"
        assert {_panel(p) for p in named} <= panels, f"edgekit {name}: a panel name not from edgekit.cli.common"


# --- (b) prose wraps at the terminal ------------------------------------------------------------------------


def _command_rows(lines: list[str]) -> tuple[dict[str, list[str]], int]:
    """The Commands panel as {command: its description's rendered lines}, and the description column's width."""
    start = next(i for i, x in enumerate(lines) if x.lstrip().startswith("╭─ Commands"))
    rows: dict[str, list[str]] = {}
    desc_at = avail = None
    name = None
    for raw in lines[start + 1:]:
        if raw.lstrip().startswith("╰"):
            break
        inner = raw.strip()[1:-1]  # between the panel's │ borders
        if desc_at is None:
            m = re.match(r" (\S+)\s+", inner)
            desc_at = m.end()
            avail = len(inner) - desc_at - 1  # the column's right padding
        head = inner[:desc_at].strip()
        if head:
            name = head
        rows.setdefault(name, []).append(inner[desc_at:].rstrip())
    return rows, avail


def _first_paragraph(cmd) -> str:
    import inspect

    return inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0]


@pytest.mark.parametrize("width", WIDTHS)
def test_command_list_shows_each_first_paragraph_whole(render, width):
    """`edgekit --help`: each command's description is its help's whole first paragraph (no text cut or
    eaten as rich markup), a complete sentence."""
    rows, _ = _command_rows(render(["--help"], width))
    root = _root()
    assert set(rows) == set(root.commands)
    for name, lines in rows.items():
        shown = _collapse(" ".join(lines))
        assert shown == _collapse(_literal(_first_paragraph(root.commands[name]))), name
        assert shown.endswith("."), f"edgekit {name}: {shown!r} is not a complete sentence"


@pytest.mark.parametrize("width", WIDTHS)
def test_command_list_wraps_at_the_terminal(render, width):
    """No description line in `edgekit --help` (and the groups' own command lists) ends where the next word
    would still have fitted: e.g. not 'estimate memory per │ device and time per'."""
    for args in (["--help"], *([*p, "--help"] for p, c in _commands() if hasattr(c, "commands"))):
        rows, avail = _command_rows(render(args, width))
        for name, lines in rows.items():
            assert not _premature_breaks(lines, avail), (args, name, _premature_breaks(lines, avail))


def _description(lines: list[str]) -> list[list[str]]:
    """The rendered paragraphs between `Usage:` and the first panel, each a list of lines (leading pad off)."""
    i = next(i for i, x in enumerate(lines) if x.strip().startswith("Usage:"))
    j = next(j for j, x in enumerate(lines) if x.lstrip().startswith("╭"))
    paras, cur = [], []
    for x in lines[i + 1:j]:
        x = x.rstrip()
        if x.strip():
            cur.append(x[1:])
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    return paras


@pytest.mark.parametrize("width", WIDTHS)
def test_command_help_prose_wraps_at_the_terminal(render, width):
    """`edgekit CMD --help`: every prose paragraph is all there and breaks only where the terminal is full;
    example lines (indented) keep their breaks."""
    import inspect

    for path, cmd in [((), _root()), *_commands()]:
        source = [p for p in inspect.cleandoc(cmd.help or "").split("\n\n") if p.strip()]
        shown = _description(render([*path, "--help"], width))
        assert len(shown) == len(source), (path, shown)
        for src, lines in zip(source, shown):
            if any(x[:1].isspace() for x in src.splitlines()):
                continue  # an example block
            assert _collapse(" ".join(lines)) == _collapse(_literal(src)), path
            bad = _premature_breaks(lines, width - 2)
            assert not bad, f"edgekit {' '.join(path)} --help at {width} columns breaks early: {bad}"


def test_examples_fit_an_80_column_terminal(render):
    """Example commands are copied from the terminal: none may be wrapped there (a wrapped line pastes as two
    commands)."""
    for path, cmd in _commands():
        shown = {x.strip() for x in render([*path, "--help"], 80)}
        for para in (cmd.help or "").split("\n\n"):
            for line in para.splitlines():
                if line[:1].isspace():
                    assert line.strip() in shown, f"edgekit {' '.join(path)} --help wraps {line.strip()!r}"


def test_help_texts_survive_rich_markup():
    """Typer renders help as rich markup: a literal [...] (e.g. pip install 'edgekit[lab]') must be escaped,
    else it vanishes as a style tag."""
    for path, cmd in [((), _root()), *_commands()]:
        for what, text in [("help", cmd.help), *((p.name, getattr(p, "help", None)) for p in cmd.params)]:
            if not text:
                continue
            assert _plain(text) == _literal(text), f"edgekit {' '.join(path)} {what}: markup ate part of {text!r}"
