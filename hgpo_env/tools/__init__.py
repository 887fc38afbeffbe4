"""Tools over any registered env (``python -m hgpo_env check | audit | panel``): the contract's
health check, the grouping audit, transition tables and the shipped evaluation panels.

May import :mod:`hgpo_env.contract`, :mod:`hgpo_env.prompting` and :mod:`hgpo_env.textenv`.
"""
