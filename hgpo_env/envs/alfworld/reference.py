"""alfworld's own ``AlfredTWEnv`` on chosen game files: the yardstick for parity and speed.

Only tests and benchmarks use this. It builds the environment exactly as ``AlfredTWEnv.init_env``
does for evaluation (demangler without shuffling, the gamefile info, batch size 1), minus the
directory walk that needs ``traj_data.json``: the game files are given instead.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hgpo_env.envs.alfworld.containment import contained


def _config(empty_dir: str, max_steps: int) -> dict[str, Any]:
    return {
        "env": {
            "goal_desc_human_anns_prob": 0.0,
            "task_types": [1, 2, 3, 4, 5, 6],
            "domain_randomization": False,
            "expert_type": "handcoded",
        },
        "dataset": {
            "data_path": empty_dir,
            "eval_id_data_path": empty_dir,
            "eval_ood_data_path": empty_dir,
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": max_steps}},
    }


class ReferenceEnv:
    """``AlfredTWEnv`` playing ``game_files``; each :meth:`reset` starts the next game in its order.

    ``reset`` returns (observation, admissible commands, game file); ``step`` returns
    (observation, admissible commands, won).
    """

    def __init__(self, game_files: Sequence[Path], max_steps: int = 50) -> None:
        from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

        quiet = contextlib.redirect_stderr(io.StringIO())  # its game scan draws a progress bar
        with tempfile.TemporaryDirectory() as empty, contained(), quiet:
            alfred = AlfredTWEnv(_config(empty, max_steps), train_eval="eval_in_distribution")
            alfred.game_files = [str(path) for path in game_files]
            alfred.num_games = len(alfred.game_files)
            self._env = alfred.init_env(batch_size=1)

    def reset(self) -> tuple[str, list[str], str]:
        with contained():
            obs, infos = self._env.reset()
        return obs[0], list(infos["admissible_commands"][0]), infos["extra.gamefile"][0]

    def step(self, command: str) -> tuple[str, list[str], bool]:
        with contained():
            obs, _, _, infos = self._env.step([command])
        return obs[0], list(infos["admissible_commands"][0]), bool(infos["won"][0])

    def close(self) -> None:
        self._env.close()
