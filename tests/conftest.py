"""Test set-up: float64 is on so oracles can run in double precision (paths under test get float32 inputs)."""

import jax

jax.config.update("jax_enable_x64", True)
