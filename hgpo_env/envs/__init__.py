"""Environment families. Each lives in its own subpackage, imported only when made.

Above the text-env machinery: may import :mod:`hgpo_env.contract`, :mod:`hgpo_env.prompting` and
:mod:`hgpo_env.textenv`; nothing of the tools, the server or the pool.
"""
