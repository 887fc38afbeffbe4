"""The prompt and memory kinds: how a step's prompt is written from the episode so far (a
window of K steps, compaction, notes), the admissible actions it lists, and the options that
choose a kind.

May import :mod:`hgpo_env.contract` only.
"""
