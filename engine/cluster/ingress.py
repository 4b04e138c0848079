"""The ingress deployment: the router app (engine/router/proxy.py) as a Ray Serve FastAPI
ingress, built on its replica (a builder: the router's threads and locks never travel)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..router.presets import ModelSpec
from ..server.state import ServerOptions

APP = "ggstation"


@dataclass(frozen=True)
class IngressConfig:
    """What the CLI hands the ingress (plain data, pickled to its replica)."""

    specs: dict[str, ModelSpec]
    options: ServerOptions
    models_max: int = 4
    autoload: bool = True
    load_timeout_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)


def ingress_app(config: IngressConfig):
    """The Serve application (`.bind()`-ed) whose one replica serves the HTTP API."""
    from ray import serve

    def build():
        from ..router.proxy import create_router_app
        from ..server.state import ServerState
        from .router import RayRouter
        from .upstream import RayUpstream

        router = RayRouter(
            config.specs,
            [],
            env=config.env,
            models_max=config.models_max,
            autoload=config.autoload,
            load_timeout_s=config.load_timeout_s,
        ).start()
        app = create_router_app(router, ServerState(config.options), RayUpstream(router))
        router.load_startup_models()
        return app

    actor: dict[str, object] = {"num_cpus": 0}
    if config.env:
        actor["runtime_env"] = {"env_vars": dict(config.env)}

    class Ingress:
        pass

    deployment = serve.deployment(
        name="Ingress", num_replicas=1, ray_actor_options=actor, max_ongoing_requests=1024
    )(serve.ingress(build)(Ingress))
    return deployment.bind()
