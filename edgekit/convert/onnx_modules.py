"""Which PyTorch module an ONNX node comes from, read from the torch.export -> ONNX exporter's node metadata
(``pkg.torch.onnx.name_scopes`` / ``class_hierarchy``, or the older ``namespace`` string). One lookup for every
reader: the on-device op profile (``devices/profile.py``) and the microcontroller's op check (``micro/onnx_ops.py``)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import NodeProto

ROOT = ""  # the module of ops in the model's own forward (no submodule)


def literal_list(text: str | None) -> list[str] | None:
    """The exporter's list of names, from its metadata string; None when there is none or it does not parse."""
    if not text:
        return None
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else None


def module_of(node: NodeProto) -> tuple[str, str | None] | None:
    """(module path, class name) from the exporter's metadata on one ONNX node (``ROOT`` for an op of the model's
    own forward), or None when the node carries none."""
    md = {p.key: p.value for p in node.metadata_props}
    scopes = literal_list(md.get("pkg.torch.onnx.name_scopes"))
    classes: Sequence[str | None] | None = literal_list(md.get("pkg.torch.onnx.class_hierarchy"))
    if scopes is None and md.get("namespace"):
        # ": __main__.Net/blocks: torch.nn...Sequential/blocks.0: __main__.Block/add: aten.add.Tensor"
        parts = [p.split(":", 1) for p in md["namespace"].split("/")]
        scopes = [p[0].strip() for p in parts]
        classes = [p[1].strip() if len(p) > 1 else None for p in parts]
    if not scopes:
        return None
    module = scopes[-2] if len(scopes) >= 2 else ROOT
    cls = classes[-2] if classes and len(classes) >= 2 and len(classes) == len(scopes) else None
    return module, (cls.rsplit(".", 1)[-1] if cls else None)
