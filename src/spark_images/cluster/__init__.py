"""The cluster room: two (or more) Sparks serving one model through vLLM's Ray executor.

Owns:
- `settings`: the `cluster` section's fields and their documented Spark defaults (the one
  defaults place of this room), checked one line per problem;
- `recipe`: a minimal reader of a recipe YAML (model, serve args, cluster section);
- `plan`: the pure deployment plan (per node: `docker run`, `ray start`, NCCL/Gloo env;
  the head's `vllm serve`), its JSON form and text;
- `ray_status`: what `ray status` prints, parsed (pure);
- `facts`: the pre-flight facts per node, judged from observations (pure);
- `gate`: what the coherence gate records for a pair, and whether it may publish (pure);
- `driver`: `up` / `down` / `status`, the only module here that does I/O, and only
  through `spark_images.engine.nodes` (never python_on_whales directly).
"""
