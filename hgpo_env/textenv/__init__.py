"""The text-env machinery: the ``TextEnv`` base a game implements, the adapter that makes it a
Gymnasium env keeping the contract, registration under ``HGPO-*`` ids with a memory kind, and
what envs share (seeded randomness, data downloads, argument reading, process hygiene).

May import :mod:`hgpo_env.contract` and :mod:`hgpo_env.prompting`.
"""
