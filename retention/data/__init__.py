"""Synthetic tasks (MQAR, passkey, selective copying) and packed text (bytes or BPE) as seeded numpy batches."""

from retention.data.base import IGNORE, Batch, Dataset
from retention.data.mqar import MQAR
from retention.data.passkey import Passkey
from retention.data.prefetch import prefetch
from retention.data.selective_copy import SelectiveCopy
from retention.data.text import Text

TASKS = {"mqar": MQAR, "passkey": Passkey, "copy": SelectiveCopy, "text": Text}

__all__ = ["IGNORE", "MQAR", "TASKS", "Batch", "Dataset", "Passkey", "SelectiveCopy", "Text", "prefetch"]
