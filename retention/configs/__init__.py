"""The trainer's Hydra configs (YAML files, package data): a package so that Hydra finds them as the module
`retention.configs` wherever `retention` is installed (retention/train/cli.py)."""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))  # the folder Hydra composes from (initialize_config_dir)
