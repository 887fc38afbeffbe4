"""HGPO envs over the network as OpenEnv environments (pip install -e ".[serve]").

``python -m hgpo_env serve ENV_ID`` starts a server (:mod:`hgpo_env.serve.server`);
:class:`~hgpo_env.serve.client.HGPOEnvClient` is OpenEnv's client for it and
:class:`~hgpo_env.serve.client.RemoteEnv` a Gymnasium env over one of its sessions, which the
pool's ``backend="openenv"`` hosts. :mod:`hgpo_env.serve.wire` fixes what crosses the wire.

Above the text-env machinery (it serves any registered id): may import ``hgpo_env`` and its
contract, prompting and text-env floors; the pool (:mod:`hgpo_env.vector`) imports its client.
"""

import os
import sys

_WEB_UI = "openenv.core.env_server.web_interface"
if os.environ.get("ENABLE_WEB_INTERFACE", "false").lower() not in ("true", "1", "yes"):
    # openenv's env_server package imports its Gradio web UI eagerly (about 2.5 s of CPU and
    # 150 MB in every server, pool worker and client) and is written to go on without it; no
    # server of ours mounts that UI unless openenv's own switch, ENABLE_WEB_INTERFACE, is on.
    sys.modules.setdefault(_WEB_UI, None)  # type: ignore[arg-type]  (None: "cannot be imported")
