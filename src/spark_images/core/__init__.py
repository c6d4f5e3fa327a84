"""The core: what every room may use and nothing else is built on.

Owns: `errors` (problems, exit codes), `inputs` (bounded, strict reads of files
people hand us; one-line messages), `atomic` (writes that never leave half a
file), `buffers` (a buffer's address for the libc calls that run without the GIL:
memmem, madvise), `pieces` (a file given as its inflated chunks, read by slices and searched
without joining them). Imports nothing of spark_images but `defaults`.
"""
