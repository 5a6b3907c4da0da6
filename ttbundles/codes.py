"""The catalogue of stable diagnostic codes.

Codes never change meaning once released: tools match on them. docs/reference/codes.md
is generated from `CODES` and `WHAT_TO_DO` (scripts/gen-docs); a test keeps it current.
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
    "TTB039": "init: the folder already holds a file init would write",
    # The adapter, checked statically (never imported by validate)
    "TTB040": "a value in the class is computed, not a literal, and was not checked statically",
    "TTB041": "the arch is not one the torch reference generator (the class's base) reads",
    "TTB042": "the arch keeps recurrent state (gated delta net, Mamba, short convolution) "
    "that the metadata does not declare (capabilities.recurrent_state; a warning)",
    "TTB043": "capabilities.recurrent_state names layers other than those the checkpoint's "
    "config gives recurrent state",
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
    # The bundle's serving defaults (schema 4)
    "TTB112": "a serving default names a tool-call or reasoning parser vLLM does not have",
    "TTB113": "serving.chat_template names a file the bundle lacks or that does not read",
    # Evidence kept in the bundle (ttbundle test --keep-evidence)
    "TTB114": "evidence is stale: the bundle content changed since it was recorded",
    "TTB115": "an evidence file does not read",
    # ttbundle bench: serving speed against the declared targets (schema 5)
    "TTB116": "a performance target the bundle declares was missed (ttbundle bench)",
    "TTB117": "ttbundle bench could not measure: no server at --url, or the client failed",
    # ttbundle test: a bundle against its golden
    "TTB120": "logits differ from the golden beyond a threshold (PCC, top-1/top-5, max abs diff)",
    "TTB121": "seeded sampling is not reproducible (the same seed alone and in a batch differ)",
    "TTB122": "a seeded token lies outside the golden's top-k/top-p support",
    "TTB123": "perplexity differs from the golden's beyond the threshold",
    "TTB124": "a test path was not exercised (no chunked prefill, cache hit or device sampling)",
    "TTB125": "no golden for this checkpoint (reference does not cover it, transformers failed)",
    "TTB126": "the golden file was recorded for other prompts, settings or checkpoint",
    "TTB127": "serving the bundle for the test failed (engine start or a request)",
    "TTB128": "served embeddings differ from the golden's pooled vectors (cosine, max abs diff)",
    "TTB129": "served classification logits or probabilities differ from the golden's",
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
    "TTB145": "the trust policy requires evidence on the serving mesh; the bundle has none "
    "fresh and passed",
    "TTB146": "the bundle is already signed by another key or certificate",
    # Installing (continued)
    "TTB144": (
        "old version kept after a replace for readers inside it (the next install removes it)"
    ),
    # Configuration (plan and the platform)
    "TTB200": "no TT architecture servable here serves this checkpoint",
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
    "TTB216": "the installed vLLM lacks a part ttbundles serves with (outside the tested window)",
    "TTB217": "the installed vLLM is outside the tested window (a warning: it may still serve)",
    "TTB218": "a bundle's requires.vllm excludes the vLLM release asked about",
    "TTB220": "an image URL (or a redirect it follows) names a host that is not a public "
    "address: not fetched",
    # Speculative decoding declared by a bundle (schema 3), checked by validate
    "TTB230": "speculative decoding declared beyond what the class's model_capabilities says",
    "TTB231": "speculative capability declared below what the class says (safe: it stays off)",
    "TTB232": "spec_plan declared but the class has no spec_plan classmethod of the contract",
    "TTB233": "a declared speculative method lacks its part of the class (drafter or verify)",
    "TTB234": "the speculative declaration contradicts itself",
    # Speculative decoding
    "TTB235": "speculative decoding cannot be served as configured (method, generator, plan)",
    "TTB236": "asynchronous scheduling with speculation for a bundle without async_spec_decode",
    "TTB237": "a request speculative decoding cannot serve (refused while speculating)",
    "TTB238": "logprobs while speculating with a plan that offers no logits accept mode",
    "TTB239": "the generator broke the speculative-decoding contract (verify or drafts)",
    # Prompt logprobs (schema 3)
    "TTB240": "prompt_logprobs declared but prefill_forward does not take return_prompt_logits",
    "TTB241": "prefill_forward did not return the logits of every prompt position it was asked for",
    "TTB245": "no Tenstorrent device and MESH_DEVICE unset: vLLM has no platform to serve on",
    "TTB246": "a setting asked for was lowered to what the bundle's target supports (a warning)",
    "TTB247": "--max-model-len beyond the positions the checkpoint has",
    "TTB250": "the checkpoint's sliding window is shorter than max_model_len and the "
    "generator does not mask it",
    "TTB260": "get_kv_cache_spec names a layer the model does not have",
    "TTB261": "the class declares several KV groups but has no allocate_kv_cache_per_layer",
    "TTB262": "a feature that does not follow several KV groups yet, with hybrid KV groups",
    "TTB263": "the class answers get_kv_cache_spec but the bundle does not declare "
    "capabilities.kv_cache_spec (a warning)",
    "TTB264": "hybrid KV groups hold more per request than one group at the step budget "
    "served (a warning)",
    "TTB265": "KV groups whose layers' pages differ in size: vLLM grows a group's block "
    "size to unify them, which the host runner's block tables do not follow",
    "TTB270": "a pooling server (--runner pooling, --convert embed|classify, or a checkpoint "
    "vLLM pools by default) asked of a bundle that does not declare the pooling task asked "
    "for (no pooling at all, or not the task --convert names)",
    "TTB271": "pooling declared but the class cannot be called in the declared form "
    "(forward(input_ids, attention_mask), or prefill_forward's return_hidden_states)",
    "TTB272": "a generation server asked of a bundle that only pools (its pooling form is "
    "'forward': no prefill or decode)",
    "TTB273": "classification of the pooling form 'prefill_hidden' but the checkpoint has no "
    "classification head (score.weight) for vLLM's classifier to apply on the host",
    "TTB274": "recurrent state (gated delta net, Mamba, short convolution layers) not "
    "served in this form: an undeclared state, vLLM-owned state of other layers than "
    "gated delta nets, or a feature the state cannot follow",
    "TTB275": "block-output decode (output_tokens_per_step > 1) not served in this combination",
}


def markdown_table() -> str:
    """The table of error codes, generated from `CODES`."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| `{code}` | {meaning} |" for code, meaning in CODES.items()]
    return "\n".join(rows) + "\n"


UNVERIFIABLE: frozenset[str] = frozenset({"TTB040", "TTB057", "TTB058"})
"""Codes that say something could not be checked *here* (code outside the bundle, a main
class from an environment this machine lacks, a value only running code knows), not that
something is wrong. `--strict` leaves them as they are, so that a real TT-Metal class
validates on a machine without TT-Metal; `--strict-unverifiable` makes them errors."""


WHAT_TO_DO: dict[str, str] = {
    # What to do about each code, in general; a diagnostic's own fix line is specific to
    # its case. docs/reference/codes.md is generated from CODES and this table
    # (scripts/gen-docs), and a test fails when a code has no entry here.
    "TTB001": "Check the path: a bundle is a folder holding vllm_metadata.json, an archive "
    "ends in .ttbundle, and a folder of bundles holds bundle folders. Relative paths are "
    "read from the folder you typed the command in.",
    "TTB002": "Add a vllm_metadata.json (`ttbundle init DIR --arch ARCH` writes one), or "
    "point at the bundle's own folder rather than its parent.",
    "TTB003": "Make the file readable by this user and save it as UTF-8.",
    "TTB004": "Read the command's help (`ttbundle COMMAND -h`); the message names the "
    "option and suggests the one you probably meant.",
    "TTB005": "A bug in ttbundles. Run again with TT_BUNDLES_DEBUG=1 to see the traceback "
    "and report it with the command line you ran.",
    "TTB010": "Fix the JSON at the line and column given (a trailing comma, a missing "
    "quote or bracket).",
    "TTB011": "The file must hold one JSON object (`{...}`), not a list or a value.",
    "TTB020": "Write a schema_version this release reads (the message lists them); a "
    "field that needs a higher version names it. Write the lowest version that "
    "expresses the bundle.",
    "TTB021": "Run `ttbundle migrate DIR` to rewrite the two-key metadata as schema "
    "version 1 (`--dry-run` shows the change first).",
    "TTB030": "Remove or correct the key (the did-you-mean names the one you likely "
    "meant); free extensions start with `x-`.",
    "TTB031": "Add the field the message names.",
    "TTB032": "Give the value the type the schema asks for (the message names it).",
    "TTB033": "Give a valid value: one of the allowed values, or of the form the message "
    "names (it lists them or suggests one). An existing file init would overwrite is "
    "TTB039; an arch the reference generator does not read is TTB041.",
    "TTB034": "Write a PEP 440 version (`1.2.0`) or a specifier pip reads (`>=0.33,<0.35`).",
    "TTB035": "Use one of the mesh names the message lists (N150, N300, T3K, TG, P150x4, "
    "HOST, ...).",
    "TTB036": "Write main_class as `module:Class`, e.g. `adapter:MyGenerator`.",
    "TTB037": "Pin the checkpoint: give `revision` a commit hash of the Hugging Face repository.",
    "TTB038": "Use a device option from the reference page, with a value of its type.",
    "TTB039": "init never overwrites: choose an empty (or new) folder, or pass --keep-adapter "
    "to keep an existing adapter.py and write metadata naming its class.",
    "TTB040": "Nothing is wrong: the value is computed, so only running code knows it. "
    "`ttbundle validate --import` checks it where the class imports.",
    "TTB041": "The torch reference generator reads Llama, Mistral, Qwen2, Qwen3 and Gemma 3 "
    "(text), Gemma 4 (text; its own class), Qwen3.5 (text; its own class) and "
    "Qwen2.5-VL / Qwen3-VL (its VL classes): "
    "set arch to one it reads, or write the generator for this architecture (`ttbundle "
    "init --arch ARCH` gives the TT-NN template). `validate` says it of the metadata; "
    "`vllm serve` and `ttbundle plan` refuse such a bundle at configuration. See "
    "docs/authors/generator-contract.md.",
    "TTB042": "Declare the state: `capabilities.recurrent_state` (schema_version 6) with "
    "its owner, 'generator' when the class keeps a state slot per request (TT-Metal's "
    "Qwen3.5/3.6 classes) or 'vllm' when vLLM's KV manager holds it (MambaSpec groups), "
    "and `model_capabilities['recurrent_state']` naming the same owner in the class. "
    "The generator-owned form is served; plan says the state per request and the "
    "capacity.",
    "TTB043": "List the layers the checkpoint's config gives recurrent state (the message "
    'names them), or write `"layers": "from_config"`.',
    "TTB050": "Add the module main_class names to the bundle (`adapter:Gen` is "
    "adapter.py or adapter/__init__.py), or correct main_class.",
    "TTB051": "Fix the Python syntax at the line given.",
    "TTB052": "Define the class main_class names in that module, or correct its name.",
    "TTB053": "Implement the contract method the message names (see the generator contract).",
    "TTB054": "Add read_decode_output and process_decode_output_host, or stop declaring "
    "async_decode.",
    "TTB055": "Give decode_forward a sampling_params parameter, or stop declaring "
    "sample_on_device.",
    "TTB056": "Declare no more than the class's model_capabilities supports: lower the "
    "bundle's capability, or add the key to the class.",
    "TTB057": "Nothing is wrong here: part of the class (a base class) is outside the "
    "bundle. `ttbundle validate --import` checks it where it imports.",
    "TTB058": "Run where the serving environment (TT-Metal) is installed, or with "
    "`--strict-unverifiable --import` there to check everything.",
    "TTB059": "Safe: the feature stays off. Declare it in the bundle to use it.",
    "TTB060": "Reproduce with `ttbundle validate --import PATH`; the message gives the "
    "exception the import raised (often a missing dependency or an import-time error).",
    "TTB061": "Make the module's import quicker (no work at import time), or raise `--timeout`.",
    "TTB062": "Give the method the signature the worker calls it with (the message names "
    "the parameter): every required parameter must be one the worker passes.",
    "TTB063": "The generator raised while loading (initialize_vllm_model, "
    "get_max_tokens_all_users): read its message; often the checkpoint, the mesh or "
    "max_model_len/max_num_seqs is one it does not support.",
    "TTB064": "Remove the key from model_capabilities or use one the worker applies "
    "(the generator contract lists them).",
    "TTB065": "Write the method: the scaffold's template only raises "
    "NotImplementedError. pack, install and test refuse it until then.",
    "TTB070": "Rename one of the bundles: names are unique in a models folder.",
    "TTB071": "Make the registrations disjoint: different targets, a `when` condition, "
    "or remove one bundle.",
    "TTB080": "Re-create or download the archive again: it is not a readable .ttbundle (gzip tar).",
    "TTB081": "Re-pack the bundle with `ttbundle pack`: its MANIFEST.json is missing or invalid.",
    "TTB082": "The file changed after packing: re-pack, or get the archive again from its source.",
    "TTB083": "A file is missing from the archive or folder: re-pack or reinstall.",
    "TTB084": "A file was added after packing: remove it or re-pack.",
    "TTB085": "Refused for safety: re-pack with `ttbundle pack`, which writes only plain "
    "files and folders.",
    "TTB086": "Re-pack the archive: an entry appears twice.",
    "TTB087": "Re-pack or download the archive again: an entry is larger than its manifest says.",
    "TTB088": "The archive was altered after packing: get it again from its source.",
    "TTB089": "Choose an output folder that exists, is writable and has space (`-o DIR`).",
    "TTB090": "Pass --replace to install this version over the installed one (the "
    "message says whether it is an upgrade or a downgrade).",
    "TTB091": "Pass --models-dir DIR, or set EXTRA_MODELS_DIR.",
    "TTB092": "Check the name with `ttbundle list --models-dir DIR`.",
    "TTB093": "Nothing was changed. Fix the errors listed above it (the bundle's own "
    "validation), or pass --force to install anyway.",
    "TTB094": "The next `ttbundle install` or `uninstall` in that folder removes it; "
    "vLLM ignores it meanwhile.",
    "TTB095": "Download the archive first, then install the file; for OCI registries use "
    "`ttbundle pull REF --install`.",
    "TTB100": "Install what the bundle's `requires` asks for (the message names the "
    "package and the versions), or use a bundle for this environment.",
    "TTB101": "Informational: the bundle targets another mesh or environment. Set "
    "MESH_DEVICE or the selector it needs if you meant to serve it.",
    "TTB102": "Informational: your extra bundle serves this architecture instead of the "
    "built-in. Nothing to do unless you meant the built-in.",
    "TTB103": "Informational: TT_MODEL_CLASS_OVERRIDES serves this architecture. Unset "
    "the entry to serve the bundle.",
    "TTB104": "Write TT_MODEL_CLASS_OVERRIDES as `Arch=module:Class,...`; the message "
    "names the item that does not parse.",
    "TTB105": "Set the selector to one of the variants the message lists, or unset it "
    "for the default variant.",
    "TTB106": "Set MESH_DEVICE (or --mesh) to a preset (any case), a grid such as "
    "(4,8), or HOST for the host mesh.",
    "TTB107": "Install TT-Metal (ttnn) in this Python, or use MESH_DEVICE=HOST for the "
    "host mesh; `ttbundle doctor` shows what is found.",
    "TTB108": "Add tt and tt_model_registry to VLLM_PLUGINS (or unset it), make sure "
    "ttbundles is installed in vLLM's environment, and set MESH_DEVICE; `ttbundle "
    "doctor` says which is missing.",
    "TTB110": "Declare the capability the path needs, or drop the path from tests.paths or --path.",
    "TTB111": "Fix the file the tests section names (prompt file, image or recorded "
    "golden): it must exist inside the bundle and parse.",
    "TTB112": "Name a parser the installed vLLM lists (the message names the closest), or "
    "install a vLLM release that has it; the operator may also pass --tool-call-parser / "
    "--reasoning-parser, which win over the bundle's.",
    "TTB114": "Prove the bundle again on that mesh (ttbundle test BUNDLE --model CKPT "
    "--mesh MESH --keep-evidence), or remove the stale file from evidence/.",
    "TTB115": "Record the evidence again (ttbundle test --keep-evidence) or remove the "
    "file; evidence files are written by ttbundles, not by hand.",
    "TTB116": "Make the bundle faster on that mesh, or declare the figures it reaches "
    "(performance.MESH in vllm_metadata.json); with --rounds 3 the range shows whether one "
    "slow round on a busy machine missed it.",
    "TTB117": "Give --url the address of a running vllm serve (its /health answers 200), or "
    "leave --url out and bench serves the bundle; when requests failed, the server's log "
    "says why (a prompt longer than max_model_len: lower --input-len).",
    "TTB113": "Add the template file to the bundle at the path serving.chat_template "
    "gives (relative to the bundle folder, UTF-8 Jinja), or drop the key to use the "
    "checkpoint's own template.",
    "TTB120": "Start where the hint points (the prefill, the chunks, the cache hit, a "
    "decode step) and compare the failing step's logits; `--steps` shows every step.",
    "TTB121": "Make device sampling use each request's seed independently of the batch it runs in.",
    "TTB122": "Check the device sampler's top-k/top-p filtering against the golden's.",
    "TTB123": "Check the logits over whole sequences: positions, the KV cache, the final norm.",
    "TTB124": "Make the path happen: a longer prompt or smaller chunk_size for chunked "
    "prefill, a resent prompt longer than one KV block for a prefix-cache hit, "
    "sample_on_device_mode for device sampling.",
    "TTB125": "Pick a golden that covers the checkpoint (--golden transformers, or a "
    "recorded file); the message says why this one cannot.",
    "TTB126": "Record the golden again for these prompts, settings and checkpoint "
    "(`--record FILE`).",
    "TTB127": "Read the serving log the message names ($XDG_CACHE_HOME/ttbundles/"
    "test-logs/NAME.log).",
    "TTB128": "The hint says which: a direction that differs is the pooling (vLLM's "
    "pooling type, the last real token of each right-padded row, the attention mask) or "
    "the model; a right direction at the wrong scale is a vector normalised or scaled "
    "before vLLM's head. `--steps` shows each vector's figures.",
    "TTB129": "Check the classification head and the row it is applied to (the pooled "
    "position), and that forward returns logits, not probabilities: vLLM applies its "
    "activation. `--steps` shows each vector's figures.",
    "TTB130": "Write the reference as HOST[:PORT]/REPO[:TAG] or HOST/REPO@sha256:DIGEST.",
    "TTB131": "Check the address and the network; TT_BUNDLES_REGISTRY_TIMEOUT raises the wait.",
    "TTB132": "Set TT_BUNDLES_REGISTRY_USERNAME and TT_BUNDLES_REGISTRY_PASSWORD, or "
    "`docker login` the registry.",
    "TTB133": "Check the tag or digest (the repository exists but not that reference).",
    "TTB134": "The reference points at another kind of artifact: check it names a "
    "bundle pushed with `ttbundle push`.",
    "TTB135": "The registry or the network corrupted the download: pull again; nothing "
    "was written.",
    "TTB136": "Read the registry's answer in the message; retry or ask its operator.",
    "TTB140": "Sign the bundle (`ttbundle sign DIR --key KEY`) with a key the policy "
    "trusts, or change TT_BUNDLES_TRUST.",
    "TTB141": "Re-sign after changing files, or sign with a key or certificate the "
    "policy trusts; the message says which file or key failed.",
    "TTB142": "Sign with an elliptic-curve private key in PEM on P-256, P-384 or P-521 "
    "(RSA, Ed25519 and other keys are not accepted by model-signing): "
    "`openssl ecparam -name prime256v1 -genkey -noout -out key.pem`; its public key for "
    "verify: `openssl ec -in key.pem -pubout -out key.pub`. With --certificate, the "
    "certificate must be of that key.",
    "TTB143": "Fix TT_BUNDLES_TRUST: a folder of *.pub/*.pem keys, one key file, or a "
    "JSON policy file; registration stops until it reads.",
    "TTB145": "Prove the bundle on that mesh (ttbundle test BUNDLE --model CKPT --mesh MESH "
    "--keep-evidence), sign it again (the evidence is a file the signature covers) and "
    "reinstall; or remove require_evidence from the policy file.",
    "TTB146": "Nothing was changed. Sign with the key that signed it, or add --force to "
    "replace that signature with yours (the old signer's trust in the bundle is lost).",
    "TTB144": "Informational: a replace keeps the version it replaced for readers that were "
    "inside it at the swap; the next `ttbundle install` or `uninstall` in that folder "
    "removes it (no sooner than 0.5 s after the replace). vLLM ignores it meanwhile.",
    "TTB200": "Install or enable a bundle for the checkpoint's architecture (`ttbundle "
    "list` shows what is servable here and why not the rest), or check the checkpoint's "
    "config.json architectures. For one the torch reference reads (Llama, Mistral, Qwen2, "
    "Qwen3, Gemma 3, Gemma 4 and Qwen3.5 text, their sequence classifiers), `ttbundle "
    "init models/NAME --reference --from-hf CKPT` writes a bundle that serves on the host "
    "mesh at once "
    "(EXTRA_MODELS_DIR=models); an encoder (BERT, XLM-RoBERTa) needs a bundle of the "
    "pooling form `forward` over your own generator (docs/operators/pooling.md). See "
    "docs/operators/installing.md.",
    "TTB201": "Drop --tensor-parallel-size/--pipeline-parallel-size: on Tenstorrent the "
    "mesh (MESH_DEVICE) provides that parallelism.",
    "TTB202": "Not supported yet: drop the option or feature the message names.",
    "TTB203": "Informational: the plan changed the setting to what the bundle declares; "
    "`ttbundle plan` shows every decision.",
    "TTB204": "Use a sample_on_device_mode the bundle declares, or leave it unset for "
    "host sampling.",
    "TTB205": "Use a --data-parallel-size (the lanes) that divides the total the lanes "
    "hold: --max-num-seqs is per lane, and the target's max_num_seqs, which caps it, "
    "counts all lanes.",
    "TTB206": "Drop prompt_logprobs from the request: it is not supported.",
    "TTB207": "Serve the mixture-of-experts model without --data-parallel-size.",
    "TTB208": "Check the model path or hub id, and that its config.json reads; offline, "
    "the hub cache must hold it.",
    "TTB209": "Read vLLM's reason in the message and change that option.",
    "TTB210": "Choose another --port, or stop what listens there.",
    "TTB212": "Use a --data-parallel-size the mesh splits into evenly (the message lists "
    "the sizes), and leave TT_VISIBLE_DEVICES and --device-ids unset for the server.",
    "TTB213": "Check TT-Metal on this host (`ttbundle doctor`); the message gives its "
    "error or the timeout.",
    "TTB214": "Give the KV cache more blocks (--num-gpu-blocks-override, "
    "--kv-cache-memory-bytes), or serve fewer lanes or a shorter max_model_len.",
    "TTB215": "Ask for at most what the bundle declares (--limit-mm-per-prompt may lower "
    "a limit, not raise it).",
    "TTB216": "Install a vLLM release of the tested window (`ttbundle doctor` names it; "
    "pip install 'vllm==0.34.0'), or a ttbundles release whose window includes yours. See "
    "docs/operators/upgrading-vllm.md.",
    "TTB217": "Nothing is refused: the server may still serve. To be on tested ground, "
    "install a release of the window (docs/operators/upgrading-vllm.md).",
    "TTB218": "Before the upgrade, install a release of the bundle whose requires.vllm "
    "admits the new vLLM, or stay on the current vLLM (`ttbundle compat VERSION` lists them).",
    "TTB220": "Clients: send the image as a data URL, or from a public host. Operators who "
    "mean the server to fetch images from inside its network: start vllm serve with "
    '--additional-config \'{"tt": {"allow_private_media_urls": true}}\', or a list of '
    "networks in place of true (with --allowed-media-domains to name the hosts); see "
    "docs/operators/images.md.",
    "TTB230": "Declare only what the class's model_capabilities says (supports_spec_decode, "
    "supports_async_spec_decode, the spec_requirements and spec_hidden_handoff entries), or "
    "implement it and say so in the class.",
    "TTB231": "Safe: what is left off stays off. Declare it in the bundle to serve it.",
    "TTB232": "Give the class `@classmethod def spec_plan(cls, vllm_config, max_num_seqs, "
    "requested_k)` returning a plan or a refusal, or declare spec_plan: false.",
    "TTB233": "Implement the part the message names (propose_draft_tokens for "
    "custom_class; decode_forward taking num_valid_drafts, accepted_counts and spec_mode "
    "for the verify), or drop the method from spec_decode.",
    "TTB234": "Make the declaration agree with itself as the message says (spec_decode is "
    "the master gate; custom_class needs device_propose; hidden_feed needs a handoff).",
    "TTB235": "Use a method Tenstorrent serves (ngram, or custom_class with a generator that "
    "drafts), a generator that declares supports_spec_decode and answers spec_plan, and a "
    "draft length its plan admits; or drop --speculative-config. See "
    "docs/operators/serving.md#speculative-decoding.",
    "TTB236": "Add --no-async-scheduling (vLLM turns asynchronous scheduling on by default), "
    "or serve a bundle whose class declares supports_async_spec_decode "
    "(capabilities.async_spec_decode, schema 3: the demo bundle does), or drop "
    "--speculative-config. In-process lanes (--data-parallel-size on a single-execute "
    "bundle) speculate.",
    "TTB237": "Send the request without the field the message names (response_format "
    "json_schema/json_object and a forced tool_choice reach the engine as structured "
    "outputs, which are not served while speculating), or serve without "
    "--speculative-config (greedy requests speculate with any generator; sampled ones "
    "need a plan that offers the logits accept mode).",
    "TTB238": "Ask for no logprobs on this speculating server, serve without "
    "--speculative-config, or serve a generator whose spec_plan offers the logits accept "
    "mode (logprobs are read off the verify's logits).",
    "TTB239": "Fix the generator: a verify returns format.speculative.VerifyOutput of the "
    "mode it was asked for, propose_draft_tokens a DraftOutput within the vocabulary "
    "(docs/authors/generator-contract.md#speculative-decoding).",
    "TTB240": "Let prefill_forward take return_prompt_logits (or **kwargs) and return "
    "[B, L, V] logits when it is True, or declare prompt_logprobs: false.",
    "TTB241": "Return [B, L, V] logits from prefill_forward when return_prompt_logits is "
    "True: column j of row b the distribution after its token start_pos[b] + j (the "
    "generator contract page).",
    "TTB245": "Set MESH_DEVICE=HOST to serve on the host mesh (the CPU, with the torch "
    "reference), or the mesh of the attached card (N150, N300, T3K, ...). `ls "
    "/dev/tenstorrent` or `tt-smi` shows whether a card is there; `ttbundle doctor` checks "
    "the whole set-up. VLLM_LOGGING_LEVEL=DEBUG shows vLLM's own report.",
    "TTB246": "The server serves with the lower value. Ask for at most what the target "
    "supports (the warning names the option and the value), or serve on a mesh whose "
    "target in the bundle's vllm_metadata.json allows more. Requests over the limit are "
    "refused with a note naming the bundle and its target.",
    "TTB247": "Ask for at most what the message names (the checkpoint's positions, and the "
    "bundle's target cap where it is lower), or drop --max-model-len: the server then "
    "takes the lower of the two by itself. A checkpoint whose positions stretch (RoPE "
    "scaling) says so in its config.json; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 leaves the "
    "length to vLLM, at the model's risk.",
    "TTB250": "Serve with --max-model-len at most the window (the message names it), where "
    "every query sees its whole context; or with a generator that masks keys older than the "
    "window and declares model_capabilities['supports_sliding_window'] = True (the torch "
    "reference and bundles from `ttbundle init --reference` do). See "
    "docs/operators/serving.md, sliding windows.",
    "TTB260": "Key the specs `model.layers.<i>.self_attn` for the model's layers 0 .. "
    "num_hidden_layers - 1 (None for a full-attention layer). See "
    "docs/authors/generator-contract.md, hybrid KV caches.",
    "TTB261": "Give the class `allocate_kv_cache_per_layer(per_layer_specs)` (one `(shape, "
    "dtype, tensor_idx)` per layer; layers with one tensor_idx share an allocation), or "
    "serve with --disable-hybrid-kv-cache-manager (one group, every layer its own cache).",
    "TTB262": "Serve with --disable-hybrid-kv-cache-manager (every layer keeps the whole "
    "context; the generator still masks its window), or without the feature the message "
    "names (speculative decoding, in-process data-parallel lanes). See "
    "docs/operators/kv-capacity.md.",
    "TTB263": "Declare `capabilities.kv_cache_spec: true` (schema_version 5) so the platform "
    "serves the class's KV groups on vLLM's hybrid KV-cache manager, or drop "
    "get_kv_cache_spec from the class. Until then every layer keeps the whole context.",
    "TTB264": "vLLM sizes a sliding-window layer for its window plus every token in flight "
    "(the step budget times the batches in flight), so at a budget near max_model_len the "
    "groups cost capacity. Serve with the --max-num-batched-tokens the warning names (with "
    "chunked prefill on), or with --disable-hybrid-kv-cache-manager. On the host mesh the "
    "plan chooses that budget itself unless --max-num-batched-tokens is given.",
    "TTB265": "The host runner keeps one block size for every KV group. Serve with "
    "--disable-hybrid-kv-cache-manager (every layer keeps the whole context in its own "
    "shape, one block size), or give the generator's layers shapes of one page size (KV "
    "heads x head size equal across its groups, as the tiny Gemma 4 test checkpoint's).",
    "TTB270": "Serve the checkpoint as a generation model (drop --runner pooling and "
    "--convert, or pass --runner generate where the checkpoint itself asks vLLM to pool), or "
    "serve it with a bundle whose generator pools and declares the tasks asked for. A "
    "bundle declaring embed only cannot answer --convert classify (and the reverse): ask "
    "for a task it declares (capabilities.pooling.tasks in its vllm_metadata.json).",
    "TTB271": "Give the class the method its pooling form calls, with the keywords the "
    "worker passes: forward(self, input_ids, attention_mask) for the form 'forward'; "
    "prefill_forward taking return_hidden_states (or **kwargs) and returning [B, L, hidden] "
    "when it is True for 'prefill_hidden'. Or declare the other form "
    "(docs/authors/generator-contract.md, pooling).",
    "TTB272": "Serve the bundle as a pooling model: vllm serve CKPT --runner pooling (with "
    "--convert embed or --convert classify for a *ForCausalLM checkpoint). To generate "
    "text, use a bundle whose generator has prefill_forward and decode_forward.",
    "TTB273": "Serve a *ForSequenceClassification checkpoint (its score.weight is the head "
    "vLLM's classifier applies to the pooled hidden state), or ask this one for "
    "embeddings (--convert embed). A *ForCausalLM checkpoint has no classification head.",
    "TTB274": "Declare capabilities.recurrent_state with owner 'generator' (schema_version "
    "6) for a class that keeps a state slot per request, as TT-Metal's Qwen3.5/3.6 classes "
    "do, or owner 'vllm' for gated delta net layers whose state vLLM's KV manager keeps "
    "(MambaSpec groups): both forms are served. With generator-owned state, serve without "
    "what a slot cannot follow: pooling, speculative decoding (--speculative-config), "
    "prefix caching without snapshots (give the class recurrent_prefix_snapshots and "
    "save/restore/free_recurrent_prefix, or drop capabilities.prefix_caching), in-process "
    "lanes with prefix caching. With vLLM-owned state, prefix caching is vLLM's align "
    "mode: give the class copy_recurrent_state(sources, targets) and keep chunked "
    "prefill on, or serve with "
    "--no-enable-prefix-caching; serve without --disable-hybrid-kv-cache-manager, "
    "pooling, speculative decoding and lanes. See "
    "docs/authors/generator-contract.md#recurrent-state.",
    "TTB275": "A block-output class (output_tokens_per_step > 1) is served with synchronous "
    "decode on the device sampler: serve it without --speculative-config and without "
    "in-process data-parallel lanes, with a sample_on_device_mode the bundle declares "
    "(declare sample_on_device in the bundle), and with output_tokens_per_step a positive "
    "integer. See docs/authors/generator-contract.md#block-output.",
}


def docs_page(code: str) -> str:
    """Where `code` is explained: a path in the source tree's docs, readable offline."""
    return f"docs/reference/codes.md#{code.lower()}"
