"""HGPO-TextWorldExpress-v0: TextWorld-Express games (pip install -e ".[textworld-express]"; Java)."""

from hgpo_env.envs.textworld_express.env import TextWorldExpressEnv

__all__ = ["TextWorldExpressEnv"]
