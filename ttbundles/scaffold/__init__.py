"""New bundles (`ttbundle init`, `init`), the Hugging Face config it reads (`hf_config`),
and legacy metadata rewritten to v1 (`ttbundle migrate`, `migrate`)."""
