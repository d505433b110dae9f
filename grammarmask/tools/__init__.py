"""The `grammarmask` command and what it runs: the demo, conformance, fuzzing, benchmarks."""
