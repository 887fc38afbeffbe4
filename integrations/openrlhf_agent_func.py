"""An ``--train.agent_func_path`` file for OpenRLHF that needs no code: the env comes from the environment.

    HGPO_ENV_ID=HGPO-ALFWorld-v0 HGPO_ENV_KWARGS='{"max_steps": 50}' \
        python -m openrlhf.cli.train_ppo_ray ... --train.agent_func_path integrations/openrlhf_agent_func.py

The variables must reach the vLLM engine actors (``ray job submit --runtime-env-json`` with
``env_vars``, or exported before ``ray start``). Without ``HGPO_ENV_ID`` loading fails with a
message saying so.
"""

from __future__ import annotations

import json
import os

from integrations.openrlhf_agent import agent_executor

if "HGPO_ENV_ID" not in os.environ:
    raise RuntimeError("set HGPO_ENV_ID (and optionally HGPO_ENV_KWARGS, a JSON object) to the env to play")

AgentExecutor = agent_executor(
    os.environ["HGPO_ENV_ID"], **json.loads(os.environ.get("HGPO_ENV_KWARGS", "{}"))
)
