"""Stage 4, the run around the iterations: the shared iteration and its schedule, checkpoints and
writes a kill cannot tear, metrics, stopping at a safe point, resuming, provenance, diagnostics.

May import :mod:`hgpo_train.config`, :mod:`hgpo_train.rollout`, :mod:`hgpo_train.advantage` and
:mod:`hgpo_train.update`; never a backend or the evaluation.
"""
