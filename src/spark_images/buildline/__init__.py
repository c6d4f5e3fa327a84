"""The build line, in pipeline order: plan -> render -> steps/stages/gates -> serialise -> pipeline.

Owns: `plan` (Profile -> BuildPlan, pure), `resolve` (profile files on disk ->
plan inputs), `render` (the Dockerfile and build context), `steps` (each stage
run against the engine, registry and inspectors), `stages` (their frozen
results), `gates` (the pure stop/lock table), `serialise` (record and lock
entry from the results, at the end), `pipeline` (the line itself), `record`
and `summary` (the build record and its terminal/Markdown renderings) and
`repro` (two builds, one digest). May import `core`, `profiles`, the
inspectors, the adapters and `release.lock`; nothing imports it but the CLI.
"""
