"""Scale-out on Ray (the optional extra ``hyocr[ray]``). ``serve`` runs ``hyocr serve --ray``: the API as a Ray
Serve ingress, the engine as replicas (``replica``), reached through ``engine.RayServeEngine``; ``data`` runs
``hyocr batch --ray`` as a Ray Data pipeline. Ray is imported inside functions only, so hyocr imports without it."""
