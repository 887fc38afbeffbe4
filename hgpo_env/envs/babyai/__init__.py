"""HGPO-BabyAI-v0: minigrid's BabyAI levels as text (pip install -e ".[babyai]")."""

from hgpo_env.envs.babyai.env import COMMANDS, BabyAIEnv
from hgpo_env.envs.babyai.text import describe_view

__all__ = ["COMMANDS", "BabyAIEnv", "describe_view"]
