"""Where the WebShop catalog comes from: the official files, found or downloaded, else the generated one.

Lookup order: the ``data_path`` argument, then ``$WEBSHOP_DATA``, then ``data_home()/webshop``;
a folder named by the first two must hold the files (an error otherwise), the last is used when
it does. Without any, the project's generated catalog is used, with a
:class:`GeneratedCatalogWarning`. ``data_path="generated"`` asks for it explicitly.

A folder holds ``items_shuffle_1000.json`` or ``items_shuffle.json`` (products),
``items_ins_v2_1000.json`` or ``items_ins_v2.json`` (attributes and instructions) and optionally
``items_human_ins*.json`` (human instructions). Catalogs are loaded once per process.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

from hgpo_env.envs.webshop.catalog import Catalog, load_official
from hgpo_env.envs.webshop.generated import generate_catalog
from hgpo_env.textenv import data

GENERATED = "generated"
SMALL = 1000
"""Products in the official small setting; ``*_1000`` files hold exactly these."""
_DRIVE = "https://drive.usercontent.google.com/download?export=download&confirm=t&id="
OFFICIAL_FILES: dict[str, tuple[str, str | None]] = {
    "items_shuffle_1000.json": (_DRIVE + "1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib", None),
    "items_ins_v2_1000.json": (
        _DRIVE + "1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu",
        "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
    ),
    "items_human_ins.json": (_DRIVE + "14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O", None),
}
"""File -> (URL, SHA-256) of WebShop's small setting, as its ``setup.sh`` fetches them. Only the
attributes file has a pinned checksum (verified against a copy of the official file); the others
are checked by parsing them."""
FULL_FILES: dict[str, tuple[str, str | None]] = {
    "items_shuffle.json": (_DRIVE + "1A2whVgOO0euk5O13n2iYDM0bQRkkRduB", None),
    "items_ins_v2.json": (_DRIVE + "1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi", None),
}
"""The full catalog (about 1.18 million products, several GB): ``download(full=True)``."""


class GeneratedCatalogWarning(UserWarning):
    """The env runs on the project's generated catalog, not on the WebShop benchmark."""


def find_files(folder: Path, num_products: int | None) -> tuple[Path, Path, Path | None] | None:
    """``(products, attributes, human or None)`` in ``folder``, or None when it lacks them.

    The ``*_1000`` files serve ``num_products <= 1000``; larger or unlimited catalogs prefer the
    full files when present.
    """
    small = (folder / "items_shuffle_1000.json", folder / "items_ins_v2_1000.json")
    full = (folder / "items_shuffle.json", folder / "items_ins_v2.json")
    wants_small = num_products is not None and num_products <= SMALL
    candidates = (small, full) if wants_small else (full, small)
    pair = next((c for c in candidates if c[0].is_file() and c[1].is_file()), None)
    if pair is None:
        return None
    human = sorted(folder.glob("items_human_ins*.json"))
    return pair[0], pair[1], human[0] if human else None


def data_folder(data_path: str | os.PathLike[str] | None, num_products: int | None) -> Path | None:
    """The folder to read, following the lookup order; None means the generated catalog."""
    if data_path is not None and str(data_path) == GENERATED:
        return None
    named = [(Path(data_path), "data_path")] if data_path is not None else []
    if not named and os.environ.get("WEBSHOP_DATA"):
        named = [(Path(os.environ["WEBSHOP_DATA"]), "$WEBSHOP_DATA")]
    for folder, origin in named:
        if find_files(folder.expanduser(), num_products) is None:
            raise FileNotFoundError(
                f"{origin} points to {folder}, which lacks items_shuffle[_1000].json and "
                f"items_ins_v2[_1000].json; run `python -m hgpo_env download webshop` or fix the path"
            )
        return folder.expanduser()
    home = data.data_home() / "webshop"
    return home if find_files(home, num_products) is not None else None


@functools.lru_cache(maxsize=4)
def _load(folder: Path | None, num_products: int | None) -> Catalog:
    if folder is None:
        return generate_catalog(num_products or SMALL)
    found = find_files(folder, num_products)
    assert found is not None, "data_folder checked the files"
    return load_official(*found, num_products)


def load_catalog(
    data_path: str | os.PathLike[str] | None = None, num_products: int | None = SMALL
) -> Catalog:
    """The catalog for these settings, loaded once per process (see the module docstring)."""
    folder = data_folder(data_path, num_products)
    catalog = _load(folder.resolve() if folder is not None else None, num_products)
    if catalog.source == GENERATED:
        warnings.warn(
            "WebShop data not found: using the project's GENERATED catalog, which is not the WebShop "
            "benchmark. Run `python -m hgpo_env download webshop` or set $WEBSHOP_DATA for the real one.",
            GeneratedCatalogWarning,
            stacklevel=3,
        )
    return catalog


def download(dest: Path | None = None, *, full: bool = False) -> Path:
    """Fetch WebShop's official product files into ``dest`` (default ``data_home()/webshop``).

    Files already there (with a matching checksum, where one is pinned) are kept. Each file must
    start like JSON, so an HTML error page saved in place of the data is caught. ``full`` also
    fetches the full catalog. Needs network access; offline, place the files in ``dest`` by hand.
    """
    dest = Path(dest) if dest is not None else data.data_home() / "webshop"
    files = {**OFFICIAL_FILES, **(FULL_FILES if full else {})}
    for name, (url, sha256) in files.items():
        path = data.download(url, dest / name, sha256)
        with open(path, "rb") as handle:
            start = handle.read(1024).lstrip()
        if not start.startswith((b"[", b"{")):
            path.unlink()
            raise ValueError(f"{url} did not return WebShop's {name} (it is not JSON); removed it")
    return dest
