"""serve --ray without a cluster: Ray is never imported without --ray, and a model's
deployment plan (engine/cluster/plan.py) follows the presets and the engine's estimate.

These run in the default suite, with or without the cluster extra installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.cluster.plan import ReplicaPlan, check_fits, make_plan
from engine.errors import RouterError
from engine.router.presets import ModelSpec
from engine.server.flags import parse_serve_args as parse_args

ROOT = Path(__file__).resolve().parents[1]


def test_server_and_serve_help_do_not_import_ray():
    code = (
        "import sys\n"
        "import engine.server, engine.server.http, engine.router.proxy, engine.commands.serve\n"
        "from engine.cli import main\n"
        "try:\n    main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
        "assert not bad, bad\n"
        "print('no ray')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "no ray" in r.stdout, r.stderr
    assert "--ray [ADDRESS]" in r.stdout  # the flag is documented in the help


def _spec(path: Path, **cluster: str) -> ModelSpec:
    return ModelSpec(
        "m",
        "preset",
        str(path),
        (("--model", str(path)), ("--ctx-size", "512"), ("--parallel", "3")),
        cluster=tuple(cluster.items()),
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from ggufgen import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("plan") / "m.gguf")


def test_plan_declares_one_thread_slots_and_the_engines_estimate(model):
    from engine.model_info import inspect_model

    plan = make_plan(_spec(model), [], parse_args)
    expected = inspect_model(model).estimate(n_ctx=512, n_seq_max=3).total_bytes
    assert (plan.n_threads, plan.n_slots, plan.memory_bytes) == (1, 3, expected)
    assert plan.argv[-2:] == ("--threads", "1")
    opts = plan.deployment_options()
    assert opts["num_replicas"] == 1 and "autoscaling_config" not in opts
    assert opts["ray_actor_options"] == {"num_cpus": 1, "memory": expected}
    import hashlib

    assert plan.sha256 == hashlib.sha256(model.read_bytes()).hexdigest()  # what every node must see


def test_plan_autoscales_from_the_presets(model):
    plan = make_plan(
        _spec(
            model,
            **{
                "min-replicas": "1",
                "max-replicas": "3",
                "target-ongoing-requests": "2",
                "sha256": "AB" * 32,
            },
        ),
        ["--threads", "2"],
        parse_args,
    )
    opts = plan.deployment_options()
    scaling = opts["autoscaling_config"]
    assert (
        scaling["min_replicas"],
        scaling["max_replicas"],
        scaling["target_ongoing_requests"],
    ) == (1, 3, 2.0)
    assert opts["ray_actor_options"]["num_cpus"] == 2 and plan.sha256 == "ab" * 32


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"min-replicas": "3", "max-replicas": "2"}, "min-replicas"),
        ({"max-replicas": "many"}, "not a number"),
    ],
)
def test_plan_refuses_bad_replica_counts(model, keys, message):
    with pytest.raises(RouterError, match=message):
        make_plan(_spec(model, **keys), [], parse_args)


def test_a_path_only_the_nodes_see_needs_a_declared_sha256(tmp_path):
    missing = tmp_path / "on-the-nodes.gguf"
    with pytest.raises(RouterError, match="give the file's sha256"):
        make_plan(_spec(missing), [], parse_args)
    plan = make_plan(_spec(missing, sha256="cd" * 32), [], parse_args)
    assert plan.sha256 == "cd" * 32 and plan.memory_bytes == 0  # nothing to estimate from here


def test_check_fits_names_the_largest_node():
    plan = ReplicaPlan("m", (), "", 1, 1, memory_bytes=3 << 30)
    check_fits(plan, [4 << 30, 1 << 30])
    with pytest.raises(RouterError, match="largest: 2.0 GiB"):
        check_fits(plan, [2 << 30, 1 << 30])


def test_replica_verifies_the_sha256(tmp_path):
    import hashlib

    from engine.cluster.replica import ModelFileError, verify_sha256

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(100))
    verify_sha256(f, hashlib.sha256(f.read_bytes()).hexdigest())
    with pytest.raises(ModelFileError, match="does not start"):
        verify_sha256(f, "0" * 64)


def test_a_hub_model_declares_its_listed_size_plus_a_margin(model, monkeypatch):
    from engine.cluster.plan import UNKNOWN_SIZE_FACTOR
    from engine.hub import client as hub

    listed = hub.HubFile("u/r", "r-Q8_0.gguf", "Q8_0", (hub.HubPart("r-Q8_0.gguf", 1000),))
    monkeypatch.setattr(hub, "resolve", lambda spec, filename=None, token=None: listed)
    spec = ModelSpec("m", "preset", "", (("--hf-repo", "u/r:Q8_0"),))
    plan = make_plan(spec, [], parse_args)
    assert plan.memory_bytes == int(1000 * UNKNOWN_SIZE_FACTOR) and plan.sha256 == ""
    cached = hub.HubFile("u/r", "r-Q8_0.gguf", "Q8_0", listed.parts, local_path=model)
    monkeypatch.setattr(hub, "resolve", lambda spec, filename=None, token=None: cached)
    from engine.model_info import inspect_model

    assert (
        make_plan(spec, [], parse_args).memory_bytes
        == inspect_model(model).estimate(n_ctx=4096).total_bytes
    )
