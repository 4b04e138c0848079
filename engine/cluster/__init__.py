"""`ggstation serve --ray [ADDRESS]`: the same HTTP API served from a Ray Serve application.

    ingress deployment (FastAPI, @serve.ingress) = the router app (engine/router/proxy.py)
        RayRouter (router.py): the router's state machine and --models-max; each model's
            "child" is a Serve application instead of a process
        RayUpstream (upstream.py): requests reach a model through its deployment handle
    one application per model, one deployment: ModelReplica (replica.py)
        each replica: one engine context (the Scheduler, -np slots), the single-model app
            (engine/server/http.py) answering in process; --threads as num_cpus, the engine's
            memory estimate as Ray's `memory` resource (plan.py)

Nothing here is imported without --ray, and only launch.py, router.py, upstream.py and
ingress.py import Ray (the extra `ggstation[cluster]`).
"""
