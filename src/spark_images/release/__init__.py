"""The release side: what happens to a built image after its gates.

Owns: `lock` (images.lock.json: typed entries, reading and writing),
`publish` (the rules of promotion: a tag only moves to a proven digest) and
`monitor` (whether a newer vLLM release is worth a profile bump). May import
`core`, `profiles`, `registry.reference` and the inspectors' verdict modules;
never the build line.
"""
