"""Who made a bundle, and whether it may be served: signatures, the policy, provenance.

`signature` reads a signature file cheaply (JSON only: registration shows signers);
`signing` and `verification` call the OpenSSF `model-signing` package (imported only
there: it brings cryptography and sigstore); `policy` decides from `TT_BUNDLES_TRUST`;
`provenance` is the record install and pull write.
"""
