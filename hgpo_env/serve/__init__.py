"""HGPO envs over the network as OpenEnv environments (pip install -e ".[serve]").

``python -m hgpo_env serve ENV_ID`` starts a server (:mod:`hgpo_env.serve.server`);
:class:`~hgpo_env.serve.client.HGPOEnvClient` is OpenEnv's client for it and
:class:`~hgpo_env.serve.client.RemoteEnv` a Gymnasium env over one of its sessions, which the
pool's ``backend="openenv"`` hosts. :mod:`hgpo_env.serve.wire` fixes what crosses the wire.

Above the text-env machinery (it serves any registered id): may import ``hgpo_env`` and its
contract, prompting and text-env floors; the pool (:mod:`hgpo_env.vector`) imports its client.
"""
