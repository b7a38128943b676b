"""infertune.testing: instruments for the test suite and the benchmarks, never imported by the product.

scripted_server: an OpenAI-compatible server that answers on a script (TTFT and ITL per token), the
load generator's reference. ground_truth: what that server recorded, to compare the load generator's
measurements against. An import-linter contract keeps infertune.cli/operator/tuner/engine off it.
"""
