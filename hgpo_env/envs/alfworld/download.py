"""Fetching the official ALFWorld text games (the files ``alfworld-download`` fetches).

The releases publish no checksums, so none are pinned: a download is trusted as far as HTTPS,
the announced size and the archive's own integrity (every zip CRC) go, and the unpacked folder
must show the three splits.
"""

from __future__ import annotations

from pathlib import Path

from hgpo_env.envs.alfworld.games import SPLITS, split_dir
from hgpo_env.textenv.data import check_archive, data_home, safe_extract
from hgpo_env.textenv.data import download as fetch

GAMES_URL = "https://github.com/alfworld/alfworld/releases/download/0.4.0/json_2.1.2_tw-pddl.zip"
"""Every split's ``game.tw-pddl`` files (what the text env needs)."""
TRAJ_URL = "https://github.com/alfworld/alfworld/releases/download/0.2.2/json_2.1.1_json.zip"
"""ALFRED's ``traj_data.json`` files: only needed to run alfworld's own ``AlfredTWEnv``."""


def official_root() -> Path:
    """Where :func:`download` puts the data by default."""
    return data_home() / "alfworld" / "official"


def download(dest: Path | None = None, *, traj_data: bool = False) -> Path:
    """Download and unpack the official games into ``dest`` (default :func:`official_root`).

    Returns the data root to pass as ``data_path`` (or ``$ALFWORLD_DATA``). Interrupted
    downloads resume; archives are removed once unpacked.
    """
    root = Path(dest).expanduser() if dest is not None else official_root()
    for url in (GAMES_URL, TRAJ_URL) if traj_data else (GAMES_URL,):
        archive = fetch(url, root / ".downloads" / url.rsplit("/", 1)[-1], None, verify=check_archive)
        safe_extract(archive, root)
        archive.unlink()
    for split in SPLITS:
        split_dir(root, split)  # raises naming the split the archive lacked
    return root
