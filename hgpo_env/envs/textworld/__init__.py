"""HGPO-TextWorld-v0: any TextWorld game files (pip install -e ".[textworld]")."""

from hgpo_env.envs.textworld.env import TextWorldEnv, find_games

__all__ = ["TextWorldEnv", "find_games"]
