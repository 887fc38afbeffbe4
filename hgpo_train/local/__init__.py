"""The single-machine backend: the shared iteration with a Hugging Face (or vLLM) generator and
the PPO update in this process. The other backend is :mod:`hgpo_train.openrlhf`.

May import every stage; only :mod:`hgpo_train.cli` imports a backend.
"""
