"""The registry room: the ONLY package that speaks the OCI distribution API."""
