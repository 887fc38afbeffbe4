"""Gymnasium environments for LLM agents that emit context fingerprints for group RL.

``import hgpo_env`` registers the ``HGPO-*`` ids; see :mod:`hgpo_env.info` for the ``info``
contract and :mod:`hgpo_env.fingerprint` for the fingerprint definition.
"""

from hgpo_env.actions import ParsedResponse, ParseResponse, parse_response
from hgpo_env.adapter import Raw, TextAdapter, TextEnvSpec
from hgpo_env.compaction import CompactionMemory, SummaryRequest
from hgpo_env.core import TextEnv
from hgpo_env.fingerprint import Fingerprinter, canonical_text
from hgpo_env.memory import KStepMemory, PromptTemplate
from hgpo_env.memory_kinds import MEMORY_KINDS
from hgpo_env.notes import NotesMemory
from hgpo_env.registration import ENV_CLASSES, make_agent_env, register_envs, register_text_env

register_envs()

__all__ = [
    "ENV_CLASSES",
    "MEMORY_KINDS",
    "CompactionMemory",
    "Fingerprinter",
    "KStepMemory",
    "NotesMemory",
    "ParseResponse",
    "ParsedResponse",
    "PromptTemplate",
    "Raw",
    "SummaryRequest",
    "TextAdapter",
    "TextEnv",
    "TextEnvSpec",
    "canonical_text",
    "make_agent_env",
    "parse_response",
    "register_envs",
    "register_text_env",
]
