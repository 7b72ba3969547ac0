"""ONNX -> TFLite for models with 4-D tensors whose C, H and W are equal (a Segformer stage at 64x64:
tokens (N, 256, 16) reshaped to a 16x16x16 map) feeding a padded Conv. onnx2tf 1.28 guesses such a
tensor's layout wrong (its layout is told from shapes); edgekit's layout hints fix it."""

import numpy as np
import pytest

pytest.importorskip("onnx2tf")


def _tokens_model(form: str):
    import torch
    from torch import nn

    class Tokens(nn.Module):
        """Patch embedding -> tokens -> LayerNorm -> back to a 16x16x16 map -> padded strided Conv
        (Segformer's stage-to-stage patch embedding)."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, 16, 4, stride=4)
            self.norm = nn.LayerNorm(16)
            self.down = nn.Conv2d(16, 8, 3, stride=2, padding=1)

        def forward(self, x):
            t = self.norm(self.embed(x).flatten(2).transpose(1, 2))  # (N, 256, 16)
            if form == "reshape_permute":  # Segformer's own form: (N, H, W, C) then to NCHW
                f = t.reshape(-1, 16, 16, 16).permute(0, 3, 1, 2)
            else:  # channels first, then the map
                f = t.transpose(1, 2).reshape(-1, 16, 16, 16)
            return self.down(f)

    torch.manual_seed(0)
    return Tokens().eval()


def _onnx(tmp_path, form: str):
    import torch

    from edgekit.inputs.source import load_onnx

    path = tmp_path / f"{form}.onnx"
    torch.onnx.export(_tokens_model(form), (torch.randn(1, 3, 64, 64),), str(path), dynamo=True, external_data=False,
                      input_names=["pixel_values"], output_names=["y"])
    return load_onnx(path).artifact


@pytest.mark.parametrize("form", ["reshape_permute", "transpose_reshape"])
def test_equal_chw_before_a_padded_conv_converts_within_parity(tmp_path, form):
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.onnx_to_tflite import TfliteConfig, onnx_to_tflite

    art = _onnx(tmp_path, form)
    xs = [np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype(np.float32)]
    # without the hints onnx2tf's graph is numerically off (the bug the hints exist for)
    bad = onnx_to_tflite(art, tmp_path / "nohints.tflite", TfliteConfig(layout_hints=False), parity_inputs=xs)
    assert bad.lineage[-1].metrics["parity_violations"], "onnx2tf now gets this layout right by itself"
    assert bad.lineage[-1].metrics["parity"]["max_abs_err"] > 1e-2
    out = tmp_path / "m.tflite"
    got = convert_to_tflite(art, out, TfliteConfig(), parity_inputs=xs)
    m = got.lineage[-1].metrics
    assert m["route"] == "onnx2tf" and m["routes_tried"] == [] and m["parity_violations"] == []
    assert m["parity"]["max_abs_err"] < 1e-4 and m["parity"]["cosine"] > 0.99999
    assert len(m["layout_hints"]) == 1 and out.is_file()


def test_hints_only_for_the_ambiguous_pattern(tmp_path):
    import onnx

    from edgekit.convert.onnx2tf_prepare import layout_hints

    named, hints = layout_hints(onnx.load(str(_onnx(tmp_path, "reshape_permute").path)))
    assert [h["param_name"] for h in hints] == ["perm"] and hints[0]["values"] == [0, 1, 2, 3]
    named, hints = layout_hints(onnx.load(str(_onnx(tmp_path, "transpose_reshape").path)))
    assert hints[0]["post_process_transpose_perm"] == [0, 2, 3, 1]
    # an ordinary CNN has no such tensor: onnx2tf gets no param file
    import torch
    from torch import nn

    path = tmp_path / "cnn.onnx"
    torch.onnx.export(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1)).eval(),
                      (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, opset_version=17)
    assert layout_hints(onnx.load(str(path))) == (None, [])


@pytest.mark.slow
def test_zoo_segformer_converts_to_fp32_tflite_within_parity(tmp_path):
    """The zoo's trained Segformer (64x64, stage 0 is 16x16x16): before the hints every route failed
    parity (max abs err ~2, cosine 0.91-0.97); now the pseudo_ops=Erf route passes."""
    from edgekit.convert.chain import convert_to_tflite
    from edgekit.convert.onnx_to_tflite import TfliteConfig
    from edgekit.convert.torch_to_onnx import export_onnx
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source
    from tests import zoo

    m = zoo.get("seg")
    src = load_source(m.pt2, workdir=tmp_path)
    ev = load_npz(m.eval, x_key=None, require_labels=False)
    xs = [x[:8] for x in ev.xs]
    onnx_art = export_onnx(src, tmp_path / "seg.onnx", xs)
    art = convert_to_tflite(onnx_art, tmp_path / "seg.tflite", TfliteConfig(), source=src, parity_inputs=xs)
    met = art.lineage[-1].metrics
    assert met["route"] == "onnx2tf(pseudo_ops=Erf)" and met["parity_violations"] == []
    assert met["parity"]["max_abs_err"] < 1e-3 and met["parity"]["cosine"] > 0.99999
    assert met["chain_parity"]["max_abs_err"] < 1e-3
