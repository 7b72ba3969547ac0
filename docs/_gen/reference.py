"""The generated reference pages: the CLI (walked from the Typer app's click command tree) and the report, recipe,
target and ship schemas (from the pydantic models' JSON schema, one field table per model).

Nothing here is committed as Markdown: the mkdocs hook (``hooks.py``) renders these pages at every build, so a
flag or a field added in the code is in the next build's reference. Field descriptions come from the model
(``Field(description=...)``) and, where a field has none, from the comment on its line or the comment lines
right above it in the source: the code's own words, in one place.
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import re
import textwrap
import tokenize
from typing import Any


def _cell(text: Any) -> str:
    """A Markdown table cell: one line, pipes and HTML-looking text escaped."""
    s = " ".join(str(text).split())
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


# --- the CLI --------------------------------------------------------------------------------------------------


def _help_markdown(text: str) -> str:
    """A command's help: prose paragraphs as text, indented paragraphs (the examples) as one code block each
    run of them."""
    out: list[str] = []
    code: list[str] = []
    for para in inspect.cleandoc(text or "").split("\n\n"):
        lines = para.splitlines()
        if any(ln[:1].isspace() for ln in lines):
            code.append(textwrap.dedent(para).strip("\n"))
            continue
        if code:
            out.append("```text\n" + "\n\n".join(code) + "\n```")
            code = []
        if para.strip():
            out.append(_cell(para).replace("\\|", "|"))
    if code:
        out.append("```text\n" + "\n\n".join(code) + "\n```")
    return "\n\n".join(out)


def _type_name(param: Any) -> str:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    name = getattr(annotation, "__name__", None) or str(annotation or "text")
    return {"Path": "path", "str": "text", "int": "integer", "float": "number", "bool": "boolean"}.get(name, name)


def _param_row(param: Any) -> str:
    # duck-typed: Typer vendors its own click (typer._click), so click's classes are not the ones here
    is_argument = param.param_type_name == "argument"
    if is_argument:
        name = f"`{(param.metavar or param.name).upper()}`"
        kind = _type_name(param) + " argument" + (", required" if param.required else "")
    else:
        name = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        kind = "flag" if param.is_flag else _type_name(param)
        if param.multiple:
            kind += ", repeatable"
        if param.required:
            kind += ", required"
    default = param.default
    if callable(default) or default in (None, (), [], False) or is_argument:
        default = ""
    else:
        default = f"`{default}`"
    return f"| {name} | {_cell(kind)} | {default} | {_cell(getattr(param, 'help', None) or '')} |"


def _command_md(cmd: Any, path: list[str], ctx: Any) -> list[str]:
    name = " ".join(path)
    args = [
        f"{(p.metavar or p.name).upper()}{'...' if p.nargs == -1 else ''}"
        for p in cmd.params
        if p.param_type_name == "argument"
    ]
    usage = " ".join([name, "[OPTIONS]", *args, *(["COMMAND [ARGS]..."] if hasattr(cmd, "list_commands") else [])])
    parts = [f"## `{name}`", "", _help_markdown(cmd.help or ""), "", f"```text\n{usage}\n```", ""]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False) and p.name != "help"]
    if params:
        parts += ["| argument / option | kind | default | what it does |", "|---|---|---|---|"]
        parts += [_param_row(p) for p in params]
        parts.append("")
    if hasattr(cmd, "list_commands"):
        for sub_name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, sub_name)
            if sub is None or sub.hidden:
                continue
            parts += _command_md(sub, [*path, sub_name], sub.context_class(sub, info_name=sub_name, parent=ctx))
    return parts


def cli_page() -> str:
    import typer.main

    from edgekit.cli.main import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="edgekit")
    head = [
        "# The command line",
        "",
        "Generated at build time from the Typer app (`edgekit/cli/`): every command, argument and option, with "
        "the help `edgekit COMMAND --help` prints.",
        "",
        "Exit codes: `0` ok (gate passed), `1` gate failed, `2` bad input or usage, `3` device or transport "
        "failure. Every command also takes `--help`.",
        "",
    ]
    return "\n".join(head + _command_md(root, ["edgekit"], ctx)) + "\n"


# --- the schemas ----------------------------------------------------------------------------------------------


def source_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, or the comment lines right above it, in ``cls``'s class body and
    those of its bases (a subclass's own comment wins)."""
    found: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if k.__module__.startswith(("edgekit", "docs"))]):
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        found.update(_comments_in(src))
    return found


def _comments_in(src: str) -> dict[str, str]:
    lines = src.splitlines()
    body_indent = None
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    for i, line in enumerate(lines, start=1):
        m = re.match(r"^(\s+)([A-Za-z_]\w*)\s*:\s*[^=]", line)
        if not m:
            continue
        indent = len(m.group(1))
        if body_indent is None:
            body_indent = indent
        if indent != body_indent:
            continue
        text = []
        j = i - 1
        while j >= 1 and lines[j - 1].strip().startswith("#") and j in comments:
            text.insert(0, comments[j])
            j -= 1
        if i in comments and not line.strip().startswith("#"):
            text.append(comments[i])
        if text:
            out[m.group(2)] = " ".join(text)
    return out


def _type_of(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop:
        kinds = [_type_of(p, defs) for p in prop["anyOf"]]
        return " or ".join(dict.fromkeys(kinds))
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    t = prop.get("type")
    if t == "array":
        if "prefixItems" in prop:
            return "[" + ", ".join(_type_of(p, defs) for p in prop["prefixItems"]) + "]"
        return "list of " + _type_of(prop.get("items", {}), defs) if prop.get("items") else "list"
    if t == "object":
        extra = prop.get("additionalProperties")
        return "map of string to " + _type_of(extra, defs) if isinstance(extra, dict) and extra else "object"
    return (
        {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean", "null": "null"}.get(
            t, "any"
        )
        if t
        else "any"
    )


def _fields(model: type) -> dict[str, Any]:
    """The model's fields by their key in the document (an alias where the field has one)."""
    return {(f.alias or n): f for n, f in model.model_fields.items()}


def _default(name: str, model: type) -> str:
    field = _fields(model).get(name)
    if field is None or field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return ""
    else:
        value = field.default
    if hasattr(value, "model_dump"):
        return "see its fields"
    return "`" + json.dumps(value, default=str) + "`"


def _model_table(model: type, schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    comments = source_comments(model)
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, prop in (schema.get("properties") or {}).items():
        field = _fields(model).get(name)
        desc = (field.description if field is not None and field.description else None) or comments.get(name, "")
        if not desc and prop.get("description"):
            desc = prop["description"]
        rows.append(
            f"| `{name}` | {_cell(_type_of(prop, defs)).replace(chr(92) + '|', '|')} "
            f"| {_cell(_default(name, model))} | {_cell(desc)} |"
        )
    return rows


def _models_by_name(root: type) -> dict[str, type]:
    """Every pydantic model reachable from ``root``'s fields, by class name (the JSON schema's $defs keys)."""
    from pydantic import BaseModel

    seen: dict[str, type] = {}

    def walk(t: Any) -> None:
        if isinstance(t, type) and issubclass(t, BaseModel):
            if t.__name__ in seen:
                return
            seen[t.__name__] = t
            for f in t.model_fields.values():
                walk(f.annotation)
        for arg in getattr(t, "__args__", ()) or ():
            walk(arg)

    walk(root)
    return seen


def _models_md(root: type, level: str) -> list[str]:
    schema = root.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    models = _models_by_name(root)
    parts = []
    # the root first, then each model where its first field reaches it (depth first, in field order): a reader meets
    # a section's model right after the section that uses it, not in alphabetical order
    order = [n for n in models if n == root.__name__ or n in defs]
    order += [n for n in defs if n not in order]
    for name in order:
        model = models.get(name)
        sub = schema if name == root.__name__ else defs[name]
        if model is None or sub.get("type") != "object" or "properties" not in sub:
            continue
        parts += [f"{level} {name}", ""]
        doc = inspect.getdoc(model) if model.__doc__ else ""
        if doc:
            parts += [_cell(doc).replace("\\|", "|"), ""]
        parts += _model_table(model, sub, defs)
        parts.append("")
    return parts


_EXTRA = {
    "allow": "Unknown keys are kept: a newer minor version's fields survive a load and a write.",
    "forbid": "Unknown keys are errors that name the file, the key and the allowed values.",
}


def schema_page(title: str, intro: str, roots: list[tuple[str, type]]) -> str:
    """One page: per root (a heading when there are several), the root's model and every model its fields use."""
    parts = [f"# {title}", "", intro, ""]
    for heading, root in roots:
        if len(roots) > 1:
            parts += [f"## {heading}", ""]
        if root.__module__.startswith("edgekit."):  # what edgekit does with keys it does not know, reading the file
            parts += [_EXTRA.get(str(root.model_config.get("extra")), ""), ""]
        parts += [
            f"Generated at build time from `{root.__module__}.{root.__qualname__}` and the models its fields use.",
            "",
        ]
        parts += _models_md(root, "###" if len(roots) > 1 else "##")
    return "\n".join(parts) + "\n"


def _load(path: str) -> type:
    mod, attr = path.split(":")
    return getattr(importlib.import_module(mod), attr)


SCHEMAS = {
    "reference/schemas/report.md": (
        "The report schema (report.json)",
        "What `edgekit deploy` writes to `OUT/report.json`: the versioned "
        "contract CI reads (`schema_version` MAJOR.MINOR: a report of the same major version loads; another is "
        "refused naming the version that wrote it). report.md, report.html and junit.xml are views of it.",
        [("report.json", "edgekit.report.model:Report")],
    ),
    "reference/schemas/recipe.md": (
        "The recipe schema (recipe.yaml)",
        "A recipe (`--recipe`) names the variants and the passes that build "
        "them, how to measure and what the gate demands. See [Recipes and the gate](../../guides/recipes-and-gate.md).",
        [("recipe.yaml", "edgekit.inputs.recipe:Recipe")],
    ),
    "reference/schemas/target.md": (
        "The target schema (targets/*.yaml)",
        "One YAML per hardware class under `targets/`: data only, validated "
        "on load (`edgekit targets show NAME`). A device (host, user, key, serial) is an entry in your inventory, "
        "never in a target file.",
        [("targets/*.yaml", "edgekit.inputs.targets:TargetSpec")],
    ),
    "reference/schemas/ship.md": (
        "The ship schema (ship/ship.json, ship/runtime.json)",
        "What `OUT/ship/` holds besides the model files: "
        "`ship.json` (what the file is, how to call it, what was measured) and `runtime.json` (how to load it to "
        "run it as it was measured). `edgekit run OUT/ship` reads this folder alone. edgekit writes these two "
        "files as plain dicts (`edgekit/orchestration/ship.py`, `edgekit/llm/ship.py`); the models below describe "
        "them, and "
        "`tests/unit/test_docs_examples.py` checks them against what `write_ship` writes.",
        [
            ("ship.json", "docs._gen.ship_schema:ShipManifest"),
            ("runtime.json", "docs._gen.ship_schema:RuntimeConfig"),
            ("ship.json when nothing shipped", "docs._gen.ship_schema:NothingShipped"),
        ],
    ),
}


def schema_pages() -> dict[str, str]:
    return {
        uri: schema_page(title, intro, [(heading, _load(p)) for heading, p in roots])
        for uri, (title, intro, roots) in SCHEMAS.items()
    }
