"""OpenRLHF's experience maker with the shared GRPO/GiGPO/HGPO step advantages.

OpenRLHF 0.11.2 has no estimator registry: ``RemoteExperienceMaker.compute_advantages_and_returns``
(experience_maker.py lines 237-340) is an if/elif over its own estimators. This subclass
replaces that one method; everything else (micro-batching in ``split_rollout_samples``, the
policy and reference forward passes in ``make_experience``) is OpenRLHF's.
"""

from __future__ import annotations

import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from hgpo_train.advantage import AdvantageConfig
from hgpo_train.openrlhf.samples import StepTable


class StepAdvantageMaker(RemoteExperienceMaker):
    """Writes each sample's step advantage (the shared code's, by :class:`StepTable`) on its response tokens.

    The KL to the reference is a loss term (``--algo.kl.use_loss``), not folded into rewards,
    so the advantage of every response token is exactly the step's scalar advantage, as in the
    single-machine trainer; ``returns`` equal the advantages (there is no critic).
    """

    def __init__(self, *args, advantage_config: AdvantageConfig, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.advantage_config = advantage_config
        self.table: StepTable | None = None

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        if self.table is None:
            raise RuntimeError(
                "StepAdvantageMaker.table is not set: the trainer sets it before each train_step"
            )
        self.table.compute_advantages(self.advantage_config)
        for experience in experiences:
            advantage = torch.from_numpy(self.table.sample_advantages(experience.index)).float()
            experience.advantages = advantage[:, None] * experience.action_mask.float()
            experience.returns = experience.advantages.clone()
            experience.info["return"] = advantage
            experience.kl = None
        return experiences
