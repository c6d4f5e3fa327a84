"""Readers behind `spark_images.readers.artifacts`, one job each (callers use `artifacts`).

- `common`: the `Member` record, progress, size caps, spooling (anonymous memory or a temporary file)
  and the `Sieve` a consumer may give, to take a summary of a big member for its bytes;
- `files`: directories, single files, wheels (zip) and NAME==VERSION requirements;
- `streams`: chunk streams, forward-only seeking and gzip/zstd inflation under a layer;
- `layers`: one image layer reader (its own tar header walk over those streams) and
  the whiteout overlay that merges layers into the file system a container sees;
- `images`: where layers come from: an OCI or docker-save archive on disk, the
  engine (`docker save` into such an archive), or a registry.
"""
