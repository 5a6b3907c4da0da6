"""`ttbundle test`: a bundle's generator, served the way `vllm serve` serves it, against a
golden reference, in the terms TT bring-up uses (PCC, top-1/top-5, max abs diff).

- `plan`: what runs, from the bundle's `tests` section and the command line;
- `prompts`: the prompt file of a bundle (token ids);
- `golden_file`: the recorded golden (`--record`), for machines without a live one;
- `metrics`, `compare`: the numbers and the thresholds;
- `report`: JSON and JUnit renderings;
- `session`: one run: the served side in a subprocess (`serving.harness`), the golden
  here.

The serving side lives in `ttbundles.serving.harness` (vLLM) and the live goldens in
`ttbundles.reference.golden` (torch); nothing here imports either at module level.
"""
