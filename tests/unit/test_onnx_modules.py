"""The one module lookup of an ONNX node (convert/onnx_modules.py) that the op profile and the microcontroller's op
check both read (issue #44)."""

from __future__ import annotations

import onnx

from edgekit.convert.onnx_modules import ROOT, module_of


def _node(**md: str) -> onnx.NodeProto:
    n = onnx.helper.make_node("Conv", ["x", "w"], ["y"], name="node_conv")
    for k, v in md.items():
        n.metadata_props.add(key=k, value=v)
    return n


def test_the_module_comes_from_the_exporter_s_scopes_or_its_namespace():
    scoped = _node(**{"pkg.torch.onnx.name_scopes": "['', 'features', 'features.0', 'conv2d']",
                      "pkg.torch.onnx.class_hierarchy": "['m.Net', 'torch.nn.Sequential', 'torch.nn.Conv2d', "
                                                        "'aten.conv2d.default']"})
    assert module_of(scoped) == ("features.0", "Conv2d")
    spaced = _node(namespace=": __main__.Net/blocks: torch.nn.Sequential/blocks.0: __main__.Block/add: aten.add")
    assert module_of(spaced) == ("blocks.0", "Block")
    assert module_of(_node(**{"pkg.torch.onnx.name_scopes": "['add']"})) == (ROOT, None)
    assert module_of(_node()) is None and module_of(_node(**{"pkg.torch.onnx.name_scopes": "not a list("})) is None


def test_the_microcontroller_s_op_check_names_the_layer_through_it():
    from edgekit.micro.onnx_ops import layer_of

    scoped = _node(**{"pkg.torch.onnx.name_scopes": "['', 'act', 'gelu']",
                      "pkg.torch.onnx.class_hierarchy": "['m.Net', 'torch.nn.GELU', 'aten.gelu.default']"})
    assert layer_of(scoped) == "act (GELU)"
    assert layer_of(_node()) == "node_conv"
    assert layer_of(_node(**{"pkg.torch.onnx.name_scopes": "['', 'add']"})) == "(the model's forward)"
