"""WebShop's caches stay bounded when every reset brings another catalog (a server that lets
clients choose ``num_products``): search engines in memory, search indexes on disk."""

from __future__ import annotations

import os
import time
import warnings

import psutil
import pytest

from hgpo_env.envs.webshop import diskcache, search
from hgpo_env.envs.webshop.sources import load_catalog


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HGPO_DATA", str(tmp_path))
    monkeypatch.setattr(search, "_ENGINES", search.OrderedDict())
    return tmp_path / "webshop"


def test_memory_and_disk_stay_flat_over_many_catalogs(data_home):
    process = psutil.Process()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated catalog says it is not the benchmark
        for n in range(20, 60):
            search.engine_for(load_catalog("generated", n))
        warm = process.memory_info().rss
        for n in range(60, 260):
            search.engine_for(load_catalog("generated", n))
    grown = (process.memory_info().rss - warm) / 2**20
    assert len(search._ENGINES) == search.MAX_ENGINES
    assert len(list((data_home / "index").iterdir())) == search.MAX_DISK_INDEXES
    assert grown < 12, f"RSS grew {grown:.1f} MiB over 200 catalogs"  # unbounded: about 25


def test_prune_drops_the_least_recently_used_beyond_count_and_bytes(data_home):
    folder = data_home / "index"
    folder.mkdir(parents=True)
    entries = []
    for number in range(5):
        entry = folder / f"e{number}"
        entry.mkdir()
        (entry / "data").write_bytes(b"x" * 1000)
        os.utime(entry, (time.time() - 100 + number, time.time() - 100 + number))  # e4 newest
        entries.append(entry)
    diskcache.touch(entries[0])  # used just now: kept
    (folder / ".writing-123").mkdir()  # another process writing: never counted or removed
    removed = diskcache.prune("index", max_entries=3, max_bytes=10_000)
    assert sorted(p.name for p in removed) == ["e1", "e2"]
    removed = diskcache.prune("index", max_entries=10, max_bytes=2_500, keep=entries[3])
    assert sorted(p.name for p in removed) == ["e4"]  # within 2,500 bytes: the kept one and the newest other
    assert sorted(p.name for p in folder.iterdir()) == [".writing-123", "e0", "e3"]
