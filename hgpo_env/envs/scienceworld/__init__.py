"""HGPO-ScienceWorld-v0: ScienceWorld tasks (pip install -e ".[scienceworld]"; Java)."""

from hgpo_env.envs.scienceworld.env import ScienceWorldEnv

__all__ = ["ScienceWorldEnv"]
