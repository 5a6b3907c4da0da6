"""`ttbundle test`: a bundle's generator, served the way `vllm serve` serves it, against a
golden reference, in the terms TT bring-up uses (PCC, top-1/top-5, max abs diff).

- `plan`: what runs, from the bundle's `tests` section and the command line (the
  section's own rules are `check.tests_section`; its prompt file and recorded golden
  are formats, `format.prompts` and `format.golden_file`);
- `metrics`, `compare`: the numbers and the thresholds;
- `report`: JSON and JUnit renderings;
- `session`: one run: the served side in a subprocess (`serving.harness`), the golden
  here.

The serving side lives in `ttbundles.serving.harness` (vLLM) and the live goldens in
`ttbundles.reference.golden` (torch); nothing here imports either at module level.
"""
