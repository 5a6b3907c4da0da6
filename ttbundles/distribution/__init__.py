"""Bundles through OCI registries: `ttbundle push` and `ttbundle pull`.

A thin client of the OCI distribution HTTP API (httpx), one concept per module:
`reference` (REF parsing), `credentials` (docker config and environment), `client`
(requests, auth challenges, errors), `artifact` (media types, deterministic manifests),
`push`, `pull`. Nothing here imports vLLM, torch or the signing stack.
"""
