"""Adapters that bring the HGPO-* environments and step-level HGPO into other RL frameworks.

One module per framework, each importing its framework on import (``import integrations`` alone
stays light; a missing framework is a one-line error naming the extra to install):

- :mod:`integrations.trl`: TRL's ``GRPOTrainer``. Environment level (an env as an
  ``environment_factory``) and step level (:class:`~integrations.trl.HGPOTrainer`).
- :mod:`integrations.openrlhf_agent`: OpenRLHF's agent API (``--train.agent_func_path``), environment
  level.

Two levels, kept apart in names and docs. **Environment level**: our env inside the framework's
env API, one growing conversation per episode, the framework's own trajectory-level estimator.
**Step level**: every step is its own sample with the K-step prompt, and the fingerprints in
``info`` decide the groups (GRPO, GiGPO or HGPO from :mod:`hgpo_train.advantage`).

The framework-neutral pieces the adapters share: :class:`integrations.session.EnvSession` (an env
played as a conversation), :func:`hgpo_train.rollout.collect.play_episodes` (groups of envs played in
lockstep for someone else's generation code), :func:`hgpo_train.rollout.collect.step_columns` and
:func:`hgpo_train.advantage.compute_advantages` (finished episodes to step advantages).
"""
