"""The OpenRLHF backend: every estimator (GRPO, GiGPO, HGPO, GraphGPO, G2PO, CRBC, MVPO) on a Ray
cluster with vLLM engines and DeepSpeed actors.

``python -m hgpo_train --backend openrlhf --config configs/openrlhf_alfworld_qwen2.5-1.5b_2gpu.yaml`` runs
OpenRLHF 0.11.2's own launcher (``openrlhf.cli.train_ppo_ray``: placement, vLLM engines, policy
and reference actors, weight sync) with its single controller, ``PPOTrainer``, replaced by
:class:`~hgpo_train.openrlhf.trainer.HGPOTrainer`, which plays the envs with the shared rollout
code, turns every step into its own sample and writes the shared advantages into it.

Import-light: nothing here imports openrlhf, ray, vllm or deepspeed at package import. A backend,
on the top floor with :mod:`hgpo_train.local`: may import every stage; only :mod:`hgpo_train.cli`
imports it.
"""
