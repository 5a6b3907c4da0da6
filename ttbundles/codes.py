"""The catalogue of stable diagnostic codes.

Codes never change meaning once released: tools match on them. The README's table of
error codes is checked against this catalogue by a test.
"""

from __future__ import annotations

CODES: dict[str, str] = {
    # Finding and reading files
    "TTB001": "path does not exist or is not a bundle, archive or folder of bundles",
    "TTB002": "bundle folder has no vllm_metadata.json",
    "TTB003": "file cannot be read or is not UTF-8",
    "TTB004": "command-line usage error (unknown option, missing or invalid argument)",
    "TTB005": "internal error (a bug in ttbundles: please report it)",
    # JSON and schema
    "TTB010": "JSON syntax error",
    "TTB011": "metadata is not a JSON object",
    "TTB020": "unsupported schema_version",
    "TTB021": "legacy metadata (no schema_version): still accepted, migrate it",
    "TTB030": "unknown key",
    "TTB031": "required field missing",
    "TTB032": "wrong type",
    "TTB033": "invalid value",
    "TTB034": "invalid version or version specifier (PEP 440 / PEP 508)",
    "TTB035": "unknown mesh name",
    "TTB036": "main_class is not of the form module:Class",
    "TTB037": "model checkpoint has no pinned revision",
    "TTB038": "invalid Tenstorrent device option (additional_config.tt)",
    # The adapter, checked statically (never imported by validate)
    "TTB040": "a value in the class is computed, not a literal, and was not checked statically",
    "TTB050": "adapter module not found in the bundle",
    "TTB051": "adapter module has a syntax error",
    "TTB052": "main class not defined in the adapter module",
    "TTB053": "main class lacks a method of the generator contract",
    "TTB054": "async_decode declared but the readback methods are missing",
    "TTB055": "sample_on_device declared but decode_forward takes no sampling_params",
    "TTB056": "model_capabilities in the class disagrees with the declared capabilities",
    "TTB057": "part of the class lies outside the bundle and was not checked statically",
    "TTB058": "main class comes from the serving environment and is not importable here",
    "TTB059": "capability declared below what the class supports (safe: it stays off)",
    # --import
    "TTB060": "importing the adapter failed",
    "TTB061": "importing the adapter timed out",
    "TTB062": "a contract method has an incompatible signature",
    "TTB063": "the generator refused the configuration while loading (it raised)",
    "TTB064": "a model_capabilities key the worker does not apply or does not know",
    "TTB065": "a contract method is still the template (only raises NotImplementedError)",
    # Across bundles
    "TTB070": "two bundles share a name",
    "TTB071": (
        "two or more bundles register the same TT architecture for overlapping targets "
        "(one diagnostic names them all)"
    ),
    # Archives
    "TTB080": "archive cannot be read",
    "TTB081": "archive manifest missing or invalid",
    "TTB082": "file digest or size does not match the manifest",
    "TTB083": "file listed in the manifest is missing",
    "TTB084": "file present but not listed in the manifest",
    "TTB085": "unsafe archive entry (absolute path, '..', link, device or other special file)",
    "TTB086": "duplicate archive entry",
    "TTB087": "entry larger than the manifest says",
    "TTB088": "root digest does not match the manifest",
    "TTB089": "archive cannot be written (output folder not writable, not a folder, or full)",
    # Installing
    "TTB090": "bundle already installed (use --replace)",
    "TTB091": "no models folder given and EXTRA_MODELS_DIR is not set",
    "TTB092": "bundle not installed",
    "TTB093": "install failed; nothing was changed",
    "TTB094": "leftover of an interrupted install or uninstall (removed by the next one)",
    "TTB095": "archive given as a URL: install takes a file (registries: ttbundle pull)",
    # Registry and compatibility
    "TTB100": "bundle requirement not met by the running environment",
    "TTB101": "bundle skipped: does not apply to this mesh or environment",
    "TTB102": "built-in bundle shadowed by an extra bundle",
    "TTB103": "bundle overridden by a TT_MODEL_CLASS_OVERRIDES entry",
    "TTB104": "TT_MODEL_CLASS_OVERRIDES is malformed",
    "TTB105": "variant selector (TT_*_TEXT_VER) names no variant",
    "TTB106": "MESH_DEVICE (or --mesh) names no mesh preset or grid",
    "TTB107": "a Tenstorrent mesh is asked for but ttnn (TT-Metal) is not importable here",
    "TTB108": "the platform plugin will not activate (VLLM_PLUGINS, entry points, no mesh)",
    # The tests section (validated with the rest of the format)
    "TTB110": "a test path needs a capability the bundle does not declare",
    "TTB111": "the tests' prompt file or recorded golden is missing or invalid",
    # ttbundle test: a bundle against its golden
    "TTB120": "logits differ from the golden beyond a threshold (PCC, top-1/top-5, max abs diff)",
    "TTB121": "seeded sampling is not reproducible (the same seed alone and in a batch differ)",
    "TTB122": "a seeded token lies outside the golden's top-k/top-p support",
    "TTB123": "perplexity differs from the golden's beyond the threshold",
    "TTB124": "a test path was not exercised (no chunked prefill, cache hit or device sampling)",
    "TTB125": "no golden for this checkpoint (reference does not cover it, transformers failed)",
    "TTB126": "the golden file was recorded for other prompts, settings or checkpoint",
    "TTB127": "serving the bundle for the test failed (engine start or a request)",
    # Distribution: OCI registries (push, pull)
    "TTB130": "registry reference is malformed",
    "TTB131": "registry unreachable or not answering in time",
    "TTB132": "registry refused the credentials (401/403)",
    "TTB133": "tag or digest not found in the registry",
    "TTB134": "the artifact is not a ttbundle (wrong artifact or media type)",
    "TTB135": "a pulled blob or manifest does not match its digest",
    "TTB136": "the registry answered with an error",
    # Trust: signatures and the policy
    "TTB140": "signature missing where the trust policy requires one",
    "TTB141": "signature invalid: files changed, wrong key or not a model-signing bundle",
    "TTB142": "signing failed (key or certificate unreadable)",
    "TTB143": "trust policy (TT_BUNDLES_TRUST) unreadable or invalid",
    # Configuration (plan and the platform)
    "TTB200": "no registered TT architecture serves this checkpoint",
    "TTB201": "parallelism is provided by the mesh, not by vLLM options",
    "TTB202": "feature not supported yet",
    "TTB203": "setting adjusted to what the bundle declares",
    "TTB204": "sample_on_device_mode not declared by the bundle",
    "TTB205": "data parallel lanes do not divide max_num_seqs",
    "TTB206": "request not supported (prompt logprobs)",
    "TTB207": "mixture-of-experts models do not support multi-process data parallelism",
    "TTB208": "model or checkpoint cannot be read",
    "TTB209": "vLLM rejected the configuration",
    "TTB210": "the server cannot listen on the port (something listens there, or not allowed)",
    "TTB212": (
        "data-parallel device groups cannot be formed or bound (uneven split, "
        "`TT_VISIBLE_DEVICES` or `--device-ids` set for the whole server, a rank without a "
        "group)"
    ),
    "TTB213": (
        "the mesh could not be split into data-parallel submeshes (TT-Metal failed or timed out)"
    ),
    "TTB214": "the KV cache is too small for every data-parallel lane",
    "TTB215": "a multimodal limit beyond what the bundle declares",
}


def markdown_table() -> str:
    """The README's table of error codes, generated from `CODES` (a test keeps the README
    equal to it: `python -c "from ttbundles.codes import markdown_table as t; print(t())"`
    prints it)."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| `{code}` | {meaning} |" for code, meaning in CODES.items()]
    return "\n".join(rows) + "\n"


UNVERIFIABLE: frozenset[str] = frozenset({"TTB040", "TTB057", "TTB058"})
"""Codes that say something could not be checked *here* (code outside the bundle, a main
class from an environment this machine lacks, a value only running code knows), not that
something is wrong. `--strict` leaves them as they are, so that a real TT-Metal class
validates on a machine without TT-Metal; `--strict-unverifiable` makes them errors."""
