"""Training data readers: .npz, .npy shards (memory-mapped), Parquet via Polars, and their errors."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import DataError
from edgekit.train.data import load_train_data


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    return rng.standard_normal((30, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 30)


def test_npz_roundtrip(tmp_path, xy):
    x, y = xy
    np.savez(tmp_path / "d.npz", x=x, y=y)
    d = load_train_data(tmp_path / "d.npz")
    assert (d.kind, d.n, d.sample_shape) == ("npz", 30, (1, 8, 8))
    xb, yb = d.take([3, 0, 29])
    np.testing.assert_array_equal(xb, x[[3, 0, 29]])
    np.testing.assert_array_equal(yb, y[[3, 0, 29]])
    assert yb.dtype == np.int64 and xb.dtype == np.float32


def test_npy_shards_are_memory_mapped_and_indexed_across_shards(tmp_path, xy):
    x, y = xy
    for i, (a, b) in enumerate([(0, 7), (7, 20), (20, 30)]):
        np.save(tmp_path / f"x_{i:05d}.npy", x[a:b])
        np.save(tmp_path / f"y_{i:05d}.npy", y[a:b])
    d = load_train_data(tmp_path)
    assert (d.kind, d.n) == ("npy-shards", 30)
    assert all(isinstance(s, np.memmap) for s in d.shards_x)
    idx = [29, 6, 7, 19, 20, 0]
    xb, yb = d.take(idx)
    np.testing.assert_array_equal(xb, x[idx])
    np.testing.assert_array_equal(yb, y[idx])


def test_npy_shard_without_labels_is_refused(tmp_path, xy):
    np.save(tmp_path / "x_00000.npy", xy[0])
    with pytest.raises(DataError, match="no labels shard y_00000.npy"):
        load_train_data(tmp_path)


def test_parquet_feature_columns_with_input_shape(tmp_path, xy):
    pl = pytest.importorskip("polars")
    x, y = xy
    cols = {f"p{i}": x.reshape(30, -1)[:, i] for i in range(64)}
    pl.DataFrame({**cols, "y": y}).write_parquet(tmp_path / "d.parquet")
    d = load_train_data(tmp_path / "d.parquet", input_shape=(1, 8, 8))
    assert (d.kind, d.n, d.sample_shape) == ("parquet", 30, (1, 8, 8))
    xb, yb = d.take([5, 1])
    np.testing.assert_allclose(xb, x[[5, 1]])
    np.testing.assert_array_equal(yb, y[[5, 1]])


def test_parquet_list_column_folder(tmp_path, xy):
    pl = pytest.importorskip("polars")
    x, y = xy
    (tmp_path / "pq").mkdir()
    for i, (a, b) in enumerate([(0, 10), (10, 30)]):
        pl.DataFrame({"x": x[a:b].reshape(b - a, -1).tolist(), "y": y[a:b]}).write_parquet(tmp_path / "pq" / f"{i}.parquet")
    d = load_train_data(tmp_path / "pq", input_shape=(1, 8, 8))
    assert d.n == 30
    np.testing.assert_allclose(d.take([25])[0], x[[25]], rtol=1e-6)


def test_parquet_errors_name_the_column(tmp_path):
    pl = pytest.importorskip("polars")
    pl.DataFrame({"a": [1.0, 2.0], "label": [0, 1]}).write_parquet(tmp_path / "d.parquet")
    with pytest.raises(DataError, match="no label column 'y'"):
        load_train_data(tmp_path / "d.parquet")
    pl.DataFrame({"a": ["s", "t"], "y": [0, 1]}).write_parquet(tmp_path / "e.parquet")
    with pytest.raises(DataError, match="feature column 'a'.*not numeric"):
        load_train_data(tmp_path / "e.parquet")


@pytest.mark.parametrize("y, match", [
    (np.zeros(30, np.float32), "integer class indices"),
    (np.zeros(29, np.int64), "30 inputs but 29 labels"),
    (np.zeros((30, 3), np.int64), "one class index per sample"),
])
def test_bad_labels(tmp_path, xy, y, match):
    np.savez(tmp_path / "d.npz", x=xy[0], y=y)
    with pytest.raises(DataError, match=match):
        load_train_data(tmp_path / "d.npz")


def test_unknown_kind_missing_and_bad_shape(tmp_path, xy):
    with pytest.raises(DataError, match="not found"):
        load_train_data(tmp_path / "nope.npz")
    (tmp_path / "d.csv").write_text("1,2\n")
    with pytest.raises(DataError, match="unknown kind"):
        load_train_data(tmp_path / "d.csv")
    np.savez(tmp_path / "d.npz", x=xy[0], y=xy[1])
    with pytest.raises(DataError, match="--input-shape 3,8,8 needs 192"):
        load_train_data(tmp_path / "d.npz", input_shape=(3, 8, 8))
