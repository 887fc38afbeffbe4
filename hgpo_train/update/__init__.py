"""Stage 3 of an iteration, the policy update: the model and its reference, log-probs, the PPO
loss and its mini-/micro-batched optimisation, and a run's policy with its generator.

Credit (stage 2) is :mod:`hgpo_train.advantage`. May import :mod:`hgpo_train.config`,
:mod:`hgpo_train.rollout` and :mod:`hgpo_train.advantage`; nothing of a later stage.
"""
