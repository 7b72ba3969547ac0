"""PyTorch -> Core ML for the model kinds that used to fail with "Core ML does not have general
support for non-contiguous dim order": a squeeze-excitation + hardswish CNN, a small transformer
encoder, a dilated 1-D conv net, a two-input int64 text classifier and a two-output model. Each is
exported from a *view* (a permuted image, a transposed feature matrix, a column of a token table),
as real pipelines do, saved with torch.export.save and loaded back the way edgekit loads a .pt2.
Prediction needs macOS; on Linux the spec is validated and parity is null with the reason."""

import platform

import numpy as np
import pytest

pytest.importorskip("coremltools")
torch = pytest.importorskip("torch")
nn = torch.nn


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int = 4):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(c, c // r, 1)
        self.expand = nn.Conv2d(c // r, c, 1)
        self.act = nn.Hardswish()
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


class SECNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Hardswish())
        self.se = SqueezeExcite(16)
        self.fc_gate = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        v = self.se(self.stem(x)).mean((2, 3))
        return self.head(v * nn.functional.hardsigmoid(self.fc_gate(v)))


class TextEncoder(nn.Module):
    """nn.TransformerEncoder (batch_first, 2 layers, d=32) over token embeddings; with a mask input
    it is the usual input_ids + attention_mask classifier."""

    def __init__(self, layers: int = 2, d: int = 32, vocab: int = 100, classes: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            return self.head(self.enc(self.emb(input_ids)).mean(1))
        h = self.enc(self.emb(input_ids), src_key_padding_mask=attention_mask == 0)
        m = attention_mask.unsqueeze(-1).float()
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1))


class FeatureEncoder(nn.Module):
    """The same encoder over a linear projection of float features."""

    def __init__(self, features: int = 8, d: int = 32):
        super().__init__()
        self.proj = nn.Linear(features, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        return self.head(self.enc(self.proj(x)).mean(1))


class DilatedTCN(nn.Module):
    def __init__(self, c_in: int = 2, c: int = 16):
        super().__init__()
        self.inp = nn.Conv1d(c_in, c, 1)
        self.blocks = nn.ModuleList(nn.Conv1d(c, c, 3, padding=d, dilation=d) for d in (1, 2, 4, 8))
        self.head = nn.Linear(c, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + torch.relu(block(h))
        return self.head(h.mean(-1))


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 8, 3, padding=1)
        self.cls = nn.Linear(8, 3)
        self.reg = nn.Linear(8, 5)

    def forward(self, x):
        v = self.conv(x).mean(-1)
        return self.cls(v), self.reg(v)


def _views(n: int):
    """n samples per model, each example the kind of view a pipeline hands torch.export."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (12, n), generator=g)  # a (tokens, samples) table: a sample is a column
    mask = torch.ones(12, n, dtype=torch.long)
    mask[9:, ::2] = 0
    return {
        "se_cnn": (SECNN, [torch.randn(16, 16, 3, generator=g).permute(2, 0, 1).unsqueeze(0) for _ in range(n)]),
        "transformer_ids": (TextEncoder, [ids[:, i:i + 1].T for i in range(n)]),
        "transformer_features": (FeatureEncoder, [torch.randn(8, 12, generator=g).T.unsqueeze(0) for _ in range(n)]),
        "dilated_tcn": (DilatedTCN, [torch.randn(64, 2, generator=g).T.unsqueeze(0) for _ in range(n)]),
        "two_heads": (TwoHeads, [torch.randn(20, 2, generator=g).T.unsqueeze(0) for _ in range(n)]),
    }, (ids, mask)


def _save(tmp, name, model, example_args, samples: list[tuple], keys: list[str]):
    """export -> torch.export.save -> an .npz of eval inputs (the user's side of the round trip)."""
    torch.manual_seed(0)
    ep = torch.export.export(model.eval(), tuple(example_args))
    pt2 = tmp / f"{name}.pt2"
    torch.export.save(ep, str(pt2))
    arrays = {k: np.concatenate([s[j].numpy() for s in samples]) for j, k in enumerate(keys)}
    np.savez(tmp / f"{name}.npz", **arrays)
    return pt2, tmp / f"{name}.npz"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coreml-models")
    views, (ids, mask) = _views(4)
    out = {}
    for name, (cls, xs) in views.items():
        assert not xs[0].is_contiguous()  # the case under test: the example is a view
        torch.manual_seed(0)
        out[name] = _save(tmp, name, cls(), (xs[0],), [(x,) for x in xs], ["x"])
    torch.manual_seed(0)
    pairs = [(ids[:, i:i + 1].T, mask[:, i:i + 1].T) for i in range(4)]
    out["text_two_inputs"] = _save(tmp, "text_two_inputs", TextEncoder(layers=1, classes=2), pairs[0], pairs,
                                   ["input_ids", "attention_mask"])
    return out


def _convert(pt2, npz, tmp_path, keys=("x",), precision="fp32"):
    from edgekit.convert.api import convert

    return convert(str(pt2), to="coreml", precision=precision, out=tmp_path / "m.mlpackage", eval_data=npz,
                   x_key=tuple(keys))


def _assert_validated(art, out_dir):
    from edgekit.formats import Format

    assert art.format == Format.COREML and art.path.is_dir() and art.path.parent == out_dir
    m = art.lineage[-1].metrics
    assert art.lineage[-1].name == "torch->coreml" and m["spec"]["operations"] > 5
    assert m["spec"]["inputs"] == [s.name for s in art.io.inputs]
    assert m["spec"]["outputs"] == [s.name for s in art.io.outputs]
    if platform.system() != "Darwin":
        assert m["parity"] is None and "needs macOS" in m["parity_reason"] and "parity_violations" not in m
    return m


@pytest.mark.parametrize("name,ops", [("se_cnn", 40), ("transformer_ids", 100), ("transformer_features", 100),
                                      ("dilated_tcn", 30)])
def test_model_exported_from_a_view_converts_through_edgekit(saved, tmp_path, name, ops):
    pt2, npz = saved[name]
    art = _convert(pt2, npz, tmp_path)
    m = _assert_validated(art, tmp_path)
    assert m["spec"]["operations"] > ops and m["spec"]["output_dtypes"] == ["float32"]
    layout = m["reexport"]  # the lineage says the program was re-exported, and why
    assert layout["reason"] == "non-contiguous input dim order"
    assert layout["input_dim_order"]["x" if name != "transformer_ids" else "input_ids"] != \
        list(range(len(art.io.inputs[0].shape)))
    # the re-exported program was run against the loaded one in PyTorch, on the eval samples
    assert layout["retrace_parity"]["n"] == 4 and layout["retrace_parity"]["max_abs_err"] < 1e-5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]


def test_int64_inputs_are_declared_int32_and_say_so(saved, tmp_path):
    pt2, npz = saved["transformer_ids"]
    art = _convert(pt2, npz, tmp_path)
    m = _assert_validated(art, tmp_path)
    assert m["input_casts"] == {"input_ids": "int64->int32"} and m["spec"]["input_dtypes"] == ["int32"]
    assert [(s.name, s.dtype) for s in art.io.inputs] == [("input_ids", "int32")]


def test_two_int64_inputs_text_classifier_converts(saved, tmp_path):
    pt2, npz = saved["text_two_inputs"]
    art = _convert(pt2, npz, tmp_path, keys=("input_ids", "attention_mask"))
    m = _assert_validated(art, tmp_path)
    assert m["spec"]["inputs"] == ["input_ids", "attention_mask"] and m["spec"]["input_dtypes"] == ["int32", "int32"]
    assert m["input_casts"] == {"input_ids": "int64->int32", "attention_mask": "int64->int32"}
    assert [s.shape for s in art.io.inputs] == [(1, 12), (1, 12)] and len(art.io.outputs) == 1
    assert set(m["reexport"]["input_dim_order"]) == {"input_ids", "attention_mask"}


def test_two_output_model_keeps_both_outputs(saved, tmp_path):
    pt2, npz = saved["two_heads"]
    art = _convert(pt2, npz, tmp_path, precision="fp16")
    m = _assert_validated(art, tmp_path)
    assert len(m["spec"]["outputs"]) == 2 and [s.shape for s in art.io.outputs] == [(1, 3), (1, 5)]


def test_contiguous_export_is_converted_as_it_is(tmp_path):
    """No view, no re-export: the program goes to coremltools untouched."""
    torch.manual_seed(0)
    xs = [(torch.randn(1, 2, 64),) for _ in range(3)]
    pt2, npz = _save(tmp_path, "tcn", DilatedTCN(), xs[0], xs, ["x"])
    out = tmp_path / "out"
    out.mkdir()
    art = _convert(pt2, npz, out)
    m = _assert_validated(art, out)
    assert m["reexport"] is None and m["input_casts"] == {} and m["decomposition"] == "aten"


def test_cli_converts_a_view_exported_cnn(saved, tmp_path, cli):
    pt2, npz = saved["se_cnn"]
    res = cli("convert", pt2, "--to", "coreml", "--eval-data", npz, "--out", tmp_path / "m.mlpackage")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert (tmp_path / "m.mlpackage").is_dir()


def test_retrace_check_catches_a_different_program():
    """The guard on the re-export can fail: two different models never pass it."""
    from edgekit.convert.torch_to_coreml import _retrace_parity, _user_input_values

    x = torch.randn(1, 2, 64)
    torch.manual_seed(0)
    a = torch.export.export(DilatedTCN().eval(), (x,))
    torch.manual_seed(1)
    b = torch.export.export(DilatedTCN().eval(), (x,))
    assert _retrace_parity(a, a, [x], None, _user_input_values(a)).violations("fp32") == []
    assert _retrace_parity(a, b, [x], None, _user_input_values(a)).violations("fp32")


class WithAlias(nn.Module):
    """``aten.alias`` survives every decomposition (transformers' BERT attention has one); coremltools
    has no lowering for it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(torch.ops.aten.alias(x) * 2.0))
        return torch.softmax(self.fc2(torch.ops.aten.alias(h) + 1.0), dim=-1)


def test_alias_nodes_are_dropped_before_coremltools(tmp_path):
    torch.manual_seed(0)
    xs = [(torch.randn(1, 8),) for _ in range(3)]
    pt2, npz = _save(tmp_path, "alias", WithAlias(), xs[0], xs, ["x"])
    ep = torch.export.load(str(pt2))
    assert any(n.target is torch.ops.aten.alias.default for n in ep.graph.nodes)  # the case is real
    out = tmp_path / "out"
    out.mkdir()
    _assert_validated(_convert(pt2, npz, out), out)
    # the user's program is untouched (the pass works on run_decompositions' copy)
    assert any(n.target is torch.ops.aten.alias.default for n in ep.graph.nodes)
