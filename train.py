"""`python train.py <overrides>` from the repository root: the trainer's entry point, retention/train/cli.py (installed
as the console script `retention-train`), with the packaged configs in configs/."""

from retention.train.cli import main

if __name__ == "__main__":
    main()
