"""RayRouter: the router (engine/router/supervisor.py) whose "children" are Ray Serve applications.

Everything the router decides stays its own: the model states, the queue behind
--models-max, least-recently-used eviction, acquire/release. What changes is how a model
comes up and goes away:

    UNLOADED --load()--> LOADING: plan the deployment (plan.py), check it fits a node, deploy
        the application `ggstation-model-<name>` (one deployment, ModelReplica)
    LOADING --Serve says RUNNING--> LOADED
    LOADING --DEPLOY_FAILED (a replica failed to start: bad file, sha256 mismatch...)-->
        UNLOADED, failed, with the replica's error; the application is deleted
    LOADED / LOADING --unload(), eviction--> (stopping) --the application is gone--> UNLOADED
    LOADED --the application vanished (deleted from outside)--> UNLOADED, failed

Serve's own state is the truth: one monitor thread polls `serve.status()`, and a router that
starts while model applications already run (the ingress restarted) adopts them as LOADED.
--models-max counts those applications, so it holds for the whole cluster.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Any

from ..errors import EngineError, RouterError
from ..router.presets import DEFAULT_STOP_TIMEOUT_S, ModelSpec
from ..router.supervisor import ChildServer, ModelStatus, Router
from .plan import APP_PREFIX, ReplicaPlan, app_name, check_fits, make_plan

log = logging.getLogger(__name__)

POLL_S = 0.5


class RayRouter(Router):
    """Args:
    specs: the catalogue (model name -> ModelSpec), built by the CLI.
    base_argv: serve flags every model's replicas get after their own (the CLI's).
    env: environment variables of the replica processes.
    models_max, autoload, load_timeout_s: as Router's; models_max counts applications.
    """

    def __init__(
        self,
        specs: dict[str, ModelSpec],
        base_argv: list[str],
        *,
        env: dict[str, str] | None = None,
        models_max: int = 4,
        autoload: bool = True,
        load_timeout_s: float = 600.0,
    ):
        super().__init__(
            specs,
            models_max=models_max,
            autoload=autoload,
            load_timeout_s=load_timeout_s,
            fake_timing=False,
        )
        self.base_argv = list(base_argv)
        self.env = dict(env or {})
        self.plans: dict[str, ReplicaPlan] = {}
        self._deployer_lock = threading.Lock()
        self._deployer_actor = None
        self._monitor = threading.Thread(
            target=self._poll_loop, name="ray-router-monitor", daemon=True
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> RayRouter:
        self._adopt()
        self._monitor.start()
        return self

    def stop(self) -> None:
        """Delete every model application this router runs."""
        with self._cv:
            running = [c for c in self.children.values() if c.running]
            for child in running:
                self._request_stop(child)
            self._cv.wait_for(lambda: not any(c.running for c in running), timeout=30)
        self._stop.set()

    def _adopt(self) -> None:
        """Model applications already deployed (by an earlier ingress) count as LOADED."""
        from ray import serve

        apps = serve.status().applications
        with self._cv:
            for child in self.children.values():
                if app_name(child.name) in apps:
                    child.status, child.last_used = ModelStatus.LOADED, time.monotonic()

    # -- the router's process hooks, for applications ------------------------------------------
    def _command(self, child: ChildServer, port: int) -> list[str]:
        spec = child.spec
        return [*(spec.args() if spec is not None else []), *self.base_argv, "--alias", child.name]

    def _spawn(self, child: ChildServer) -> None:  # lock held
        child.status, child.exit_code, child.error = ModelStatus.LOADING, 0, ""
        child.stopping, child.stop_deadline, child.loaded_info, child.req_count = (
            False,
            float("inf"),
            None,
            0,
        )
        child.args = self._command(child, 0)
        child.last_used = child.last_heartbeat = child.t_spawn = time.monotonic()
        log.info("deploying %s", child.name)
        self._notify("model_status", child.name, {"status": "loading"})
        threading.Thread(
            target=self._deploy, args=(child,), name=f"deploy {child.name}", daemon=True
        ).start()

    def load(self, name: str) -> ChildServer:
        """Router.load, but a model that cannot be planned or fits no node fails at once
        (reported as a failed load), before --models-max evicts anything for it."""
        child = self.get(name)
        if child.running:
            return child
        try:
            check_fits(self.plan(child), node_memory())
        except (EngineError, OSError) as e:  # RouterError for a misfit; a file that cannot be read
            with self._cv:
                child.exit_code, child.error = 1, str(e)
                self._cv.notify_all()
            log.warning("cannot load %s: %s", child.name, e)
            self._notify(
                "model_status", child.name, {"status": "unloaded", "exit_code": 1, "failed": True}
            )
            return child
        return super().load(name)

    def download(self, spec: str) -> None:
        raise RouterError(
            "POST /models (download into this machine's cache) is not available with --ray: name "
            "the model in the presets (hf-repo = user/repo:QUANT); each node pulls it when a "
            "replica starts there"
        )

    def remove(self, name: str) -> None:
        raise RouterError("DELETE /models is not available with --ray: the files live on the nodes")

    def _deploy(self, child: ChildServer) -> None:
        try:
            plan = self.plans.get(child.name) or self.plan(child)
            import ray

            ray.get(self._deployer().deploy.remote(plan))
        except Exception as e:  # any failure to deploy ends the load the same way: reported
            log.warning("cannot deploy %s: %s", child.name, e)
            self._gone(child, str(e))

    def _deployer(self):
        """The actor that deploys: Serve builds a deployment's config with process-global
        cloudpickle registrations that race the handles' own config updates, so no process
        that holds handles (this one) may deploy."""
        with self._deployer_lock:
            if self._deployer_actor is None:
                self._deployer_actor = deployer_actor(self.env)
            return self._deployer_actor

    def plan(self, child: ChildServer) -> ReplicaPlan:
        from ..server.flags import parse_serve_args

        spec = child.spec or ModelSpec(
            child.name, "models_dir", str(child.path), (("--model", str(child.path)),)
        )
        plan = make_plan(spec, [*self.base_argv, "--alias", child.name], parse_serve_args, self.env)
        self.plans[child.name] = plan
        return plan

    def _stop_child(self, child: ChildServer) -> None:
        self._request_stop(child)

    def _request_stop(self, child: ChildServer, send_exit: bool = True) -> None:  # lock held
        if child.stopping or not child.running:
            return
        child.stopping = True
        child.stop_deadline = time.monotonic() + (
            child.spec.stop_timeout if child.spec else DEFAULT_STOP_TIMEOUT_S
        )
        threading.Thread(target=_delete, args=(app_name(child.name),), daemon=True).start()
        self._cv.notify_all()

    def _reap(self, child: ChildServer, timeout: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not child.running, timeout=timeout + 5)

    def _gone(self, child: ChildServer, error: str = "") -> None:
        """The model's application is gone (deleted, or it failed): UNLOADED."""
        with self._cv:
            if not child.running:
                return
            failed = bool(error) and not child.stopping
            child.exit_code, child.error = (1, error) if failed else (0, "")
            child.status, child.stopping, child.stop_deadline = (
                ModelStatus.UNLOADED,
                False,
                float("inf"),
            )
            child.req_count, child.loaded_info = 0, None
            self._tick()
            self._cv.notify_all()
        data: dict[str, object] = {"status": "unloaded"}
        if failed:
            data.update(exit_code=1, failed=True)
        self._notify("model_status", child.name, data)

    # -- monitor -------------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._poll()
            except Exception:  # a controller hiccup: the next poll tries again
                log.debug("serve.status() failed", exc_info=True)

    def _poll(self) -> None:
        from ray import serve
        from ray.serve.schema import ApplicationStatus

        apps = serve.status().applications
        now = time.monotonic()
        with self._cv:
            running = [c for c in self.children.values() if c.running]
        for child in running:
            app = apps.get(app_name(child.name))
            if app is None:
                # deleted: by us (stopping), or from outside; a LOADING one may not be deployed yet
                if child.stopping or child.status is not ModelStatus.LOADING:
                    self._gone(child, "" if child.stopping else "its Serve application was deleted")
                elif now - child.t_spawn > self.load_timeout_s:
                    self._gone(child, f"not deployed after {self.load_timeout_s:.0f} s")
                continue
            if child.stopping:
                continue
            if app.status is ApplicationStatus.DEPLOY_FAILED:
                self._fail(child, failure_message(app))
            elif app.status is ApplicationStatus.RUNNING and child.status is ModelStatus.LOADING:
                with self._cv:
                    child.status = ModelStatus.LOADED
                    self._cv.notify_all()
                log.info("model %s deployed", child.name)
                self._notify("model_status", child.name, {"status": "loaded"})
            elif child.status is ModelStatus.LOADING and now - child.t_spawn > self.load_timeout_s:
                self._fail(
                    child, f"not running after {self.load_timeout_s:.0f} s ({failure_message(app)})"
                )

    def _fail(self, child: ChildServer, error: str) -> None:
        log.warning("model %s failed: %s", child.name, error)
        _delete(app_name(child.name))
        self._gone(child, error)

    # -- the cluster's view (/health) ------------------------------------------------------------
    def cluster_view(self) -> dict:
        """cluster_view(), each model deployment with what its plan declares per replica."""
        view = cluster_view()
        for name, dep in view["deployments"].items():
            plan = self.plans.get(name)
            if plan is not None:
                dep.update(
                    num_cpus=plan.n_threads,
                    memory_bytes=plan.memory_bytes,
                    n_slots=plan.n_slots,
                    min_replicas=plan.min_replicas,
                    max_replicas=plan.max_replicas,
                    sha256=plan.sha256,
                )
        return view


def deploy(plan: ReplicaPlan) -> None:
    """Deploy `plan`'s application and return without waiting for its replicas."""
    from ray import serve

    from .replica import ModelReplica

    # one constructor failure (a missing file, a sha256 mismatch) fails the deployment: retrying
    # would only fail again, slowly
    deployment = serve.deployment(max_constructor_retry_count=1, **plan.deployment_options())(
        ModelReplica
    )
    serve._run(deployment.bind(plan), name=app_name(plan.name), route_prefix=None, _blocking=False)


def deployer_actor(env: dict[str, str]):
    """A handle to a (new) actor whose `deploy(plan)` runs deploy() there, one at a time."""
    import ray

    class Deployer:
        def deploy(self, plan: ReplicaPlan) -> None:
            deploy(plan)

    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1}
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    return ray.remote(Deployer).options(**options).remote()


def _delete(name: str) -> None:
    from ray import serve

    try:
        serve.delete(name, _blocking=False)
    except Exception:  # already gone
        log.debug("serve.delete(%s) failed", name, exc_info=True)


def failure_message(app) -> str:
    """The line of a failed application's messages that says why (a replica's exception)."""
    texts = [app.message, *(d.message for d in app.deployments.values())]
    lines = [ln.strip() for t in texts for ln in (t or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error: " in ln and not ln.startswith("File ")]
    return (errors or lines or [str(app.status)])[-1]


def node_memory() -> list[int]:
    """The `memory` resource of every alive node."""
    import ray

    return [int(n["Resources"].get("memory", 0)) for n in ray.nodes() if n.get("Alive")]


def cluster_view() -> dict:
    """Nodes (alive, CPUs, memory) and every model deployment's status and replica states."""
    import ray
    from ray import serve

    nodes = [
        {
            "node_id": n["NodeID"],
            "address": n.get("NodeManagerAddress", ""),
            "alive": bool(n.get("Alive")),
            "cpus": n["Resources"].get("CPU", 0),
            "memory_bytes": int(n["Resources"].get("memory", 0)),
        }
        for n in ray.nodes()
    ]
    deployments = {}
    for name, app in serve.status().applications.items():
        if not name.startswith(APP_PREFIX):
            continue
        for dep_name, dep in app.deployments.items():
            deployments[name[len(APP_PREFIX) :]] = {
                "application": name,
                "deployment": dep_name,
                "status": _text(dep.status),
                "replicas": {_text(state): n for state, n in dep.replica_states.items()},
                "message": dep.message,
            }
    return {"nodes": nodes, "deployments": deployments}


def _text(value: object) -> str:
    """A Serve status, an enum or already its value."""
    return value.value if isinstance(value, enum.Enum) else str(value)
