"""HGPO-TextArena-v0: TextArena's single-player games (pip install -e ".[textarena]")."""

from hgpo_env.envs.textarena.env import TextArenaEnv

__all__ = ["TextArenaEnv"]
