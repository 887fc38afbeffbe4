"""The ``info`` contract every HGPO env keeps, at the bottom of hgpo_env: the keys a step's
``info`` carries, the context fingerprints (one per level), milestones and the response protocol.

Imports nothing else of hgpo_env, so a trainer can read the contract without an env.
"""
