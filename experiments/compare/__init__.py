"""The comparison of softmax, sliding-window, power-retention and hybrid models: presets, speed, quality
(`python -m experiments.compare.run`); experiments/compare/report.py writes its report."""
