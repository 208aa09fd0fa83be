"""Benchmarks and the comparison, run from the repository root as modules (`python -m experiments.op_speed`,
`python -m experiments.compare.run --preset cpu`); the package is not installed, the root is where Python finds it."""
