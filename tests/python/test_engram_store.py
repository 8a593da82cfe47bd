"""`EngramStore` on `mooncake.store`: the reference's cases
(`scripts/test_engram_store.py`: metadata, populate and lookup through
lists and NumPy ids, remove, and the errors) against our master, plus the
bytes of larger lookups checked row by row. As in the reference, a bad
config raises ValueError and every other misuse RuntimeError."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from mooncake.store import EngramStore, EngramStoreConfig


def config():
    cfg = EngramStoreConfig()
    cfg.table_vocab_sizes = [17, 19, 23, 29]
    cfg.embedding_dim = 8
    return cfg


@pytest.fixture
def layers(store):
    made = []

    def make(layer_id=None, with_store=True):
        layer_id = uuid.uuid4().int & 0x7FFFFFFF if layer_id is None else layer_id
        es = EngramStore(layer_id=layer_id, config=config(), store=store if with_store else None)
        if with_store:
            made.append(es)
        return es

    yield make
    for es in made:
        es.remove_from_store(force=True)


def tables(es):
    d = es.get_embedding_dim()
    return [
        np.arange(n * d, dtype=np.float32).reshape(n, d) + h * 1000
        for h, n in enumerate(es.get_table_vocab_sizes())
    ]


def test_defaults_and_validation():
    cfg = EngramStoreConfig()
    assert cfg.table_vocab_sizes == [1024] and cfg.embedding_dim == 64
    for vocab, dim in (([], 8), ([4, 0], 8), ([4, -2], 8), ([4], 0)):
        bad = EngramStoreConfig()
        bad.table_vocab_sizes, bad.embedding_dim = vocab, dim
        with pytest.raises(ValueError):
            EngramStore(1, bad)
    with pytest.raises(RuntimeError):
        EngramStore(1, config(), store=object())


def test_creation_and_metadata(layers):
    es = layers()
    cfg = config()
    assert es.get_num_heads() == len(cfg.table_vocab_sizes)
    assert es.get_embedding_dim() == cfg.embedding_dim
    assert es.get_table_vocab_sizes() == cfg.table_vocab_sizes
    assert len(es.get_store_keys()) == len(cfg.table_vocab_sizes)


def test_creation_without_store_keeps_metadata_accessible(layers):
    es = layers(layer_id=4242, with_store=False)
    assert es.get_num_heads() == 4 and es.get_embedding_dim() == 8
    assert es.get_store_keys() == [f"engram:l4242:h{h}" for h in range(4)]
    with pytest.raises(RuntimeError):
        es.populate(tables(es))
    with pytest.raises(RuntimeError):
        es.lookup([[[0, 1, 2, 3]]])
    with pytest.raises(RuntimeError):
        es.remove_from_store()


def test_populate_and_lookup_shape_with_python_lists(layers):
    es = layers()
    es.populate(tables(es))
    row_ids = [[[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [8, 9, 10, 11]]]
    out = es.lookup(row_ids)
    assert out.shape == (2, 2, 4, 8) and out.dtype == np.float32
    assert not np.isnan(out).any() and not np.isinf(out).any()


def test_lookup_matches_stored_rows_from_numpy_ids(layers):
    es = layers()
    t = tables(es)
    es.populate(t)
    row_ids = np.array([[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]], dtype=np.int64)
    out = np.asarray(es.lookup(row_ids))
    for pos in range(row_ids.shape[1]):
        for head in range(4):
            np.testing.assert_array_equal(out[0, pos, head], t[head][row_ids[0, pos, head]])


def test_lookup_list_and_numpy_paths_match(layers):
    es = layers()
    es.populate(tables(es))
    ids = [[[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [8, 9, 10, 11]]]
    np.testing.assert_array_equal(es.lookup(ids), es.lookup(np.asarray(ids, dtype=np.int64)))
    # Other integer dtypes and non-contiguous arrays are converted, as the
    # reference's forcecast does.
    as_i32 = np.asarray(ids, dtype=np.int32)
    np.testing.assert_array_equal(es.lookup(ids), es.lookup(as_i32))
    wide = np.zeros((2, 4, 4), dtype=np.int64)
    wide[:, ::2] = ids
    np.testing.assert_array_equal(es.lookup(ids), es.lookup(wide[:, ::2]))


def test_large_lookup_is_byte_exact(layers):
    es = layers()
    t = tables(es)
    es.populate(t)
    rng = np.random.default_rng(7)
    vocab = es.get_table_vocab_sizes()
    ids = np.stack([rng.integers(0, n, size=(8, 300)) for n in vocab], axis=-1)
    out = es.lookup(ids)
    want = np.stack([t[h][ids[..., h]] for h in range(4)], axis=2)
    assert out.tobytes() == want.tobytes()


def test_remove_from_store(layers, store):
    es = layers()
    es.populate(tables(es))
    assert es.remove_from_store(force=True) == es.get_num_heads()
    for key in es.get_store_keys():
        assert store.is_exist(key) == 0
    assert es.remove_from_store(force=True) == 0


def test_populate_rejects_reusing_existing_layer_keys(layers):
    es = layers()
    es.populate(tables(es))
    with pytest.raises(RuntimeError, match="populate failed"):
        es.populate(tables(es))
    # The first population is intact.
    np.testing.assert_array_equal(es.lookup([[[1, 1, 1, 1]]])[0, 0, 2], tables(es)[2][1])


def test_lookup_rejects_missing_tables(layers):
    es = layers()
    with pytest.raises(RuntimeError):
        es.lookup([[[0, 1, 2, 3]]])


def test_populate_rejects_wrong_table_shape(layers, store):
    es = layers()
    t = tables(es)
    t[0] = t[0][:-1]
    with pytest.raises(RuntimeError):
        es.populate(t)
    with pytest.raises(RuntimeError):
        es.populate(tables(es)[:3])
    with pytest.raises(RuntimeError):
        es.populate([b"x" * 8] * 4)
    assert store.batch_is_exist(es.get_store_keys()) == [0, 0, 0, 0]


def test_lookup_rejects_empty_input(layers):
    es = layers()
    es.populate(tables(es))
    with pytest.raises(RuntimeError):
        es.lookup([])
    with pytest.raises(RuntimeError):
        es.lookup([[]])


def test_lookup_rejects_wrong_head_dimension(layers):
    es = layers()
    es.populate(tables(es))
    with pytest.raises(RuntimeError):
        es.lookup(np.zeros((1, 1, es.get_num_heads() - 1), dtype=np.int64))
    with pytest.raises(RuntimeError):
        es.lookup([[[0, 1, 2]]])
    with pytest.raises(RuntimeError):
        es.lookup([[[0, 1, 2, 3]], [[0, 1, 2, 3], [0, 1, 2, 3]]])


def test_lookup_rejects_out_of_range_row_id(layers):
    es = layers()
    es.populate(tables(es))
    for bad in ([[[999, 1, 2, 3]]], [[[0, 1, 2, 29]]], [[[-1, 1, 2, 3]]]):
        with pytest.raises(RuntimeError):
            es.lookup(bad)
