"""The lm-eval adapter's fixtures: one tiny LM per process, its oracle, and the adapter over it (the byte
tokenizer, max_length MAX_LENGTH, BATCH rows per program)."""

import pytest
from flax import nnx

from retention.data.tokenizer import ByteTokenizer
from retention.eval.lm_eval_adapter import RetentionLM
from retention.nn import LM
from tests.eval.common import BATCH, CONFIG, MAX_LENGTH, Oracle


@pytest.fixture(scope="session")
def tiny_model() -> LM:
    return LM(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def oracle(tiny_model):
    return Oracle(tiny_model)


@pytest.fixture
def adapter(tiny_model):
    return RetentionLM(model=tiny_model, tokenizer=ByteTokenizer(), max_length=MAX_LENGTH, batch_size=BATCH)
