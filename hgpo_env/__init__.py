"""Gymnasium environments for LLM agents that emit context fingerprints for group RL.

``import hgpo_env`` registers the ``HGPO-*`` ids; see :mod:`hgpo_env.contract.info` for the ``info``
contract and :mod:`hgpo_env.contract.fingerprint` for the fingerprint definition.
"""

from hgpo_env.contract.fingerprint import Fingerprinter, canonical_text
from hgpo_env.prompting.actions import ParsedResponse, ParseResponse, parse_response
from hgpo_env.prompting.compaction import CompactionMemory, SummaryRequest
from hgpo_env.prompting.kinds import MEMORY_KINDS, MemoryOptions
from hgpo_env.prompting.memory import KStepMemory, PromptTemplate
from hgpo_env.prompting.notes import NotesMemory
from hgpo_env.textenv.adapter import Raw, TextAdapter, TextEnvSpec
from hgpo_env.textenv.core import TextEnv
from hgpo_env.textenv.registration import ENV_CLASSES, make_agent_env, register_envs, register_text_env

register_envs()

__all__ = [
    "ENV_CLASSES",
    "MEMORY_KINDS",
    "CompactionMemory",
    "Fingerprinter",
    "KStepMemory",
    "MemoryOptions",
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
