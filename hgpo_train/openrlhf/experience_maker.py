"""OpenRLHF's experience maker with the shared step advantages.

OpenRLHF 0.11.2 has no estimator registry: ``RemoteExperienceMaker.compute_advantages_and_returns``
(experience_maker.py lines 237-340) is an if/elif over its own estimators. This subclass
replaces that one method; everything else (micro-batching in ``split_rollout_samples``, the
policy and reference forward passes in ``make_experience``) is OpenRLHF's.
"""

from __future__ import annotations

import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from hgpo_train.openrlhf.samples import ADVANTAGE


class StepAdvantageMaker(RemoteExperienceMaker):
    """Writes each sample's step advantage (computed by the trainer, carried in
    ``info[ADVANTAGE]`` by :func:`~hgpo_train.openrlhf.samples.step_experiences`) on its response tokens.

    The KL to the reference is a loss term (``--algo.kl.use_loss``), not folded into rewards,
    so the advantage of every response token is exactly the step's scalar advantage, as in the
    single-machine trainer; ``returns`` equal the advantages (there is no critic). A response
    token the engine gave no log-prob for (NaN in ``rollout_log_probs``) gets the policy's own, so
    the off-policy correction weighs it 1, as the local trainer does.
    """

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        for experience in experiences:
            if ADVANTAGE not in experience.info:
                raise ValueError(
                    f"a sample without info[{ADVANTAGE!r}]: make the samples with "
                    "hgpo_train.openrlhf.samples.step_experiences"
                )
            advantage = experience.info.pop(ADVANTAGE).float()  # not logged twice: it is the "return"
            experience.advantages = advantage[:, None] * experience.action_mask.float()
            experience.returns = experience.advantages.clone()
            experience.info["return"] = advantage
            experience.kl = None
            behaviour = experience.rollout_log_probs
            if behaviour is not None:
                own = experience.action_log_probs.to(behaviour)
                experience.rollout_log_probs = torch.where(torch.isnan(behaviour), own, behaviour)
        return experiences
