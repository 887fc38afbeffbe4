"""Gymnasium environments for LLM agents that emit context fingerprints for group RL.

``import hgpo_env`` registers the ``HGPO-*`` ids; see :mod:`hgpo_env.info` for the ``info``
contract and :mod:`hgpo_env.fingerprint` for the fingerprint definition.
"""

from hgpo_env.actions import ParsedResponse, ParseResponse, parse_response
from hgpo_env.adapter import Raw, TextAdapter, TextEnvSpec
from hgpo_env.core import TextEnv
from hgpo_env.fingerprint import Fingerprinter, canonical_text
from hgpo_env.memory import KStepMemory, PromptTemplate
from hgpo_env.registration import ENV_CLASSES, make_agent_env, register_envs, register_text_env

register_envs()

__all__ = [
    "ENV_CLASSES",
    "Fingerprinter",
    "KStepMemory",
    "ParseResponse",
    "ParsedResponse",
    "PromptTemplate",
    "Raw",
    "TextAdapter",
    "TextEnv",
    "TextEnvSpec",
    "canonical_text",
    "make_agent_env",
    "parse_response",
    "register_envs",
    "register_text_env",
]
