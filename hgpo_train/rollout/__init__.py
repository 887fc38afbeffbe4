"""Stage 1 of an iteration, the rollout: episodes played over an env pool into a ``StepBatch``.

Here live the shared types (``episodes``: an episode, a generation, the generator protocol; ``batch``:
the columnar record every later stage reads), generation (Hugging Face, vLLM, choice-constrained
decoding), the agent loops that schedule episodes, and rollouts overlapped with updates.

May import :mod:`hgpo_train.config` and :mod:`hgpo_train.advantage` (the batch carries the
estimator's columns); nothing of a later stage.
"""
