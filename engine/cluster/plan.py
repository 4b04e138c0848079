"""What one model's Ray Serve deployment asks of the cluster, decided on the ingress before
anything is placed: the replica's serve flags, the file digest every node must see, its CPU
and memory resources, and its replica count or autoscaling (from the presets file).

No Ray import here: the plan is plain data, and `deployment_options()` is the dict
`serve.deployment(...).options(**...)` takes.

    preset keys (engine/router/presets.py CLUSTER_KEYS)     deployment option
    min-replicas, max-replicas (default 1, 1)               num_replicas, or autoscaling_config
    target-ongoing-requests (default: -np)                   autoscaling_config
    upscale-delay-s, downscale-delay-s (Ray's 30, 600)       autoscaling_config
    sha256                                                   checked on the node before loading
    -t/--threads (default 1 under --ray)                     ray_actor_options num_cpus
    the engine's memory estimate (engine/memory.py)          ray_actor_options memory
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import params
from ..errors import EngineError, RouterError
from ..router.presets import ModelSpec

log = logging.getLogger(__name__)

DEFAULT_THREADS = 1  # per replica: replicas, not threads, are how a cluster scales
UNKNOWN_SIZE_FACTOR = (
    1.25  # a file not readable here: its size plus room for the KV cache and buffers
)
_CHUNK = 1 << 20
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, on the ingress


@dataclass(frozen=True)
class ReplicaPlan:
    """One model's deployment.

    Args:
        name: the model's name (its Serve application is `app_name(name)`).
        argv: the `serve` flags each replica loads its engine with.
        sha256: hex digest the model file must have on the node ("" = not checked).
        n_threads: engine threads per replica, declared as Ray CPUs.
        n_slots: -np, sequences per replica.
        memory_bytes: the engine's estimate for one replica (0 = not declared).
        env: environment variables of the replica processes (Ray runtime_env).
    """

    name: str
    argv: tuple[str, ...]
    sha256: str
    n_threads: int
    n_slots: int
    memory_bytes: int
    min_replicas: int = 1
    max_replicas: int = 1
    target_ongoing_requests: float = 1.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)

    def deployment_options(self) -> dict:
        actor: dict[str, object] = {"num_cpus": self.n_threads}
        if self.memory_bytes > 0:
            actor["memory"] = self.memory_bytes
        if self.env:
            actor["runtime_env"] = {"env_vars": dict(self.env)}
        opts: dict[str, object] = {
            "name": DEPLOYMENT,
            "ray_actor_options": actor,
            # a few more than the slots: cheap requests (/tokenize, /props) need not queue behind
            # generations, and the scheduler queues what its slots cannot take yet
            "max_ongoing_requests": self.n_slots + 2,
            "health_check_period_s": 2.0,
            "health_check_timeout_s": 30.0,
            "graceful_shutdown_timeout_s": 5.0,
        }
        if self.max_replicas > self.min_replicas:
            opts["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                "initial_replicas": self.min_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
                "metrics_interval_s": 1.0,
                "look_back_period_s": 2.0,
            }
        else:
            opts["num_replicas"] = self.min_replicas
        return opts


DEPLOYMENT = "ModelReplica"
APP_PREFIX = "ggstation-model-"


def app_name(model: str) -> str:
    """The Serve application that holds `model`'s deployment."""
    return APP_PREFIX + model


def make_plan(
    spec: ModelSpec,
    base_argv: list[str],
    parse: Callable[[list[str]], argparse.Namespace],
    env: dict[str, str] | None = None,
) -> ReplicaPlan:
    """The deployment for `spec`, with the router's own flags (`base_argv`) after the model's.

    Raises:
        RouterError: a preset value that is not a number, replicas out of order, or a model
            file that cannot be read here for its digest.
    """
    extra = dict(spec.cluster)
    argv = [*spec.args(), *base_argv]
    args = parse(argv)
    if args.threads in (None, -1):
        argv += ["--threads", str(DEFAULT_THREADS)]
        args.threads = DEFAULT_THREADS
    n_slots = params.n_slots(args.parallel)
    lo = _number(spec.name, extra, "min-replicas", 1, int)
    hi = _number(spec.name, extra, "max-replicas", max(lo, 1), int)
    if lo < 0 or hi < 1 or hi < lo:
        raise RouterError(
            f"model '{spec.name}': need 0 <= min-replicas <= max-replicas and max-replicas >= 1 "
            f"(got {lo}, {hi})"
        )
    if lo == 0 and hi == lo:
        lo = hi = 1
    path = _local_file(args)
    return ReplicaPlan(
        name=spec.name,
        argv=tuple(argv),
        sha256=expected_sha256(spec.name, args, extra.get("sha256", ""), path),
        n_threads=int(args.threads),
        n_slots=n_slots,
        memory_bytes=estimate_bytes(args, n_slots, path),
        min_replicas=lo,
        max_replicas=hi,
        target_ongoing_requests=_number(
            spec.name, extra, "target-ongoing-requests", float(n_slots), float
        ),
        upscale_delay_s=_number(spec.name, extra, "upscale-delay-s", 30.0, float),
        downscale_delay_s=_number(spec.name, extra, "downscale-delay-s", 600.0, float),
        env=dict(env or {}),
    )


def _number(name: str, extra: dict[str, str], key: str, default, kind):
    if key not in extra:
        return default
    try:
        return kind(extra[key])
    except ValueError:
        raise RouterError(
            f"model '{name}': preset key {key} = {extra[key]!r} is not a number"
        ) from None


def _local_file(args: argparse.Namespace) -> Path | None:
    """The model file when the flags name one this machine can read (else it comes from the
    starter-model store or the Hub, on the node)."""
    if not args.model:
        return None
    path = Path(args.model).expanduser()
    return path if path.is_file() else None


def expected_sha256(name: str, args: argparse.Namespace, declared: str, path: Path | None) -> str:
    """The digest every replica checks: the preset's `sha256`, else the starter model's, else
    that of the file as the ingress sees it (so every node must see that same file)."""
    if declared:
        return declared.strip().lower()
    if args.model and path is None:
        from ..hub.store import STARTER_MODELS, resolve

        try:
            return resolve(args.model).sha256
        except EngineError:
            known = ", ".join(STARTER_MODELS)
            raise RouterError(
                f"model '{name}': {args.model} is neither a file here nor a starter model "
                f"({known}); give the file's sha256 in the preset to load it from a path "
                "only the nodes see"
            ) from None
    if path is None:
        return ""  # from the Hub: its download checks each part against the Hub's own digest
    return file_sha256(path)


def file_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def estimate_bytes(args: argparse.Namespace, n_slots: int, path: Path | None) -> int:
    """One replica's memory: the engine's estimate (weights, KV cache, buffers) when the file
    can be read here (a path, a cached starter model or Hub file); else the file's size (the
    store's, the Hub listing's) plus a margin; 0 when even that is unknown."""
    repo = params.model_source(args).hf_repo
    if path is None and repo is not None:
        from ..hub import client as hub

        try:  # the Hub's listing (or this machine's cache of it): sizes, and the file when cached
            file = hub.resolve(repo, args.hf_file or None, args.hf_token or None)
        except EngineError as e:
            log.warning(
                "%s: no memory estimate (%s); Ray places its replicas by CPUs alone", repo, e
            )
            return 0
        if file.local_path is None:
            return int(file.size * UNKNOWN_SIZE_FACTOR) if file.size else 0
        path = file.local_path
    if path is None and args.model:
        from ..hub.store import cached_path, resolve

        try:
            path = cached_path(args.model)
            size = resolve(args.model).size
        except EngineError:
            return 0
        if path is None:
            return int(size * UNKNOWN_SIZE_FACTOR)
    if path is None:
        return 0
    from ..model_info import inspect_model

    info = inspect_model(path)
    if not info.ok:
        return int(os.path.getsize(path) * UNKNOWN_SIZE_FACTOR)
    cp = params.to_context_params(params.common_params(args), n_seq_max=n_slots)
    est = info.estimate(
        n_ctx=cp.n_ctx,
        n_seq_max=cp.n_seq_max,
        type_k=cp.type_k,
        type_v=cp.type_v,
        n_ubatch=cp.n_ubatch,
        n_batch=cp.n_batch,
        kv_unified=cp.kv_unified,
    )
    return int(est.total_bytes)


def check_fits(plan: ReplicaPlan, node_memory: list[int]) -> None:
    """Refuse a model no alive node could ever hold (Ray would keep it pending forever).

    Raises:
        RouterError: `plan.memory_bytes` is more than the largest node's `memory` resource.
    """
    from ..memory import fmt_bytes

    if plan.memory_bytes <= 0 or not node_memory:
        return
    largest = max(node_memory)
    if plan.memory_bytes > largest:
        raise RouterError(
            f"model '{plan.name}' needs {fmt_bytes(plan.memory_bytes)} per replica (the engine's "
            f"estimate), more than any node of the cluster offers (largest: {fmt_bytes(largest)}); "
            "lower -c/-np or add a bigger node"
        )
