"""The profile side: what a human pinned, checked before anything is derived (pure).

Owns: `profile` (the Profile model and its loading), `values` (the grammars of
profile strings), `schema` (the declarative schema, its one-line messages and
the JSON Schema export), `toolchain` (the one rules table, with the scope each
rule can judge), `patches` (patch headers) and `reqlock` (hash-pinned
requirements locks). May import `core`, `defaults`, `registry.reference` and
`pypi` name helpers; never the build line, the release side or an inspector.
"""
