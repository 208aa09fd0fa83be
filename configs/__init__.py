"""The trainer's Hydra configs (YAML files, package data): the repository's top-level configs/, installed as the
package `retention.configs` (pyproject.toml's package-dir) so that Hydra finds them wherever `retention` is installed
(retention/train/cli.py), editable or from a wheel."""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))  # the folder Hydra composes from (initialize_config_dir)
